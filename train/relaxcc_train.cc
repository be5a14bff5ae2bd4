// relaxcc-train: data-parallel training of a small CNN or MLP on
// Fashion-MNIST with relaxcc::torch::DistributedDataParallel and any
// relaxcc algorithm, under mpirun (or inside bench/relaxcc-hosts).
//
//   mpirun -n 2 relaxcc-train --algorithm bytegrad --model cnn --epochs 1
//   relaxcc-train --compare --ranks 2 --results results/   (not under mpirun)
//
// A run prints rank 0's progress bar per epoch, then the test accuracy,
// wall time, median step time and bytes sent per rank, and writes a JSON
// summary (--json) and the accuracy curve (--curve: wall seconds, bytes sent
// per rank, test accuracy at each evaluation). Ranks whose models differ
// (local_sgd, cocktail_sgd) are averaged exactly for each evaluation, and
// keep their own models for training.
//
// --compare launches one mpirun per algorithm module, then PyTorch's own
// DistributedDataParallel (bench/peers/torch_ddp.py: plain, fp16 and PowerSGD
// hooks) with the same model, initial weights, data order and
// hyper-parameters, one run after the other, and writes results/table.md,
// results/accuracy_vs_time.png and results/accuracy_vs_bytes.png. With
// several seeds (--seeds 1,2,3) each row is the mean and spread over its
// seeds; a run that fails (or writes no complete summary) is left out, the
// table names its seed, and --compare exits 1.
// --rate R runs every run inside bench/relaxcc-hosts at R Mbit/s.
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "fashion_mnist.h"
#include "relaxcc/create_communicator.h"
#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "relaxcc/membership.h"
#include "relaxcc/rendezvous.h"
#include "relaxcc/torch/ddp.h"
#include "relaxcc/traffic_counter.h"
#include "relaxcc/ucx_communicator.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

// Every algorithm module; --compare runs them in this order.
const std::vector<std::string> kAlgorithms = {"gradient_allreduce",
                                              "bytegrad",
                                              "qadam",
                                              "cocktail_sgd",
                                              "local_sgd",
                                              "decentralized_sgd",
                                              "low_precision_decentralized_sgd",
                                              "moshpit_sgd",
                                              "async_model_average",
                                              "diloco"};
const std::vector<std::string> kPeers = {"torch_ddp", "torch_ddp_fp16", "torch_ddp_powersgd"};

struct Options {
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::string model = "mlp";
  std::string algorithm = "gradient_allreduce";
  int epochs = 1;
  int batch = 64;  // per rank
  double lr = 0.05;
  double momentum = 0.9;
  uint64_t seed = 1;
  int64_t max_steps = 0;  // per epoch; 0: the whole epoch
  int evals_per_epoch = 4;
  int threads = 1;
  std::string json, curve, init_out;
  std::string transport = "mpi";  // the wing: mpi or ucx (create_communicator.h)
  bool elastic = false;           // go on without lost members, admit newcomers (ucx)
  bool join = false;              // a newcomer to a running --elastic job
  int64_t join_wait_ms = 60000;   // how long a newcomer waits for its admission
  // --compare
  bool compare = false;
  int ranks = 2;
  std::string results = "results";
  std::string seeds = "1";
  std::string only;  // comma-separated subset of algorithms and peers
  double rate = 0;   // Mbit/s; 0: no relaxcc-hosts
  bool peers = true;
  std::string hosts_tool = RELAXCC_SOURCE_DIR "/bench/relaxcc-hosts";
  std::string peer_script = RELAXCC_SOURCE_DIR "/bench/peers/torch_ddp.py";
  std::string python = "/usr/bin/python3";
};

[[noreturn]] void usage(const std::string& error) {
  std::fprintf(stderr,
               "relaxcc-train: %s\n"
               "usage: mpirun -n N relaxcc-train [--algorithm NAME] [--model mlp|cnn] "
               "[--epochs E] [--batch B] [--lr LR] [--momentum M] [--seed S] [--max-steps N] "
               "[--evals-per-epoch K] [--threads T] [--data DIR] [--json PATH] [--curve PATH] "
               "[--init-out PATH] [--transport mpi|ucx] [--elastic] [--join [--join-wait MS]]\n"
               "       (ucx: RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT or RELAXCC_RENDEZVOUS, "
               "with or without mpirun; --elastic: ucx, gradient_allreduce, bytegrad or qadam, "
               "the survivors of a lost process go on and newcomers are admitted at step ends; "
               "--join: a newcomer to a running --elastic job (same options and store "
               "address; no RANK/WORLD_SIZE), admitted within --join-wait ms; bytes sent count "
               "the first view only)\n"
               "       relaxcc-train --compare [--ranks N] [--results DIR] [--seeds 1,2,3] "
               "[--only a,b] [--rate MBIT] [--no-peers] [the options above]\n"
               "algorithms: gradient_allreduce bytegrad qadam cocktail_sgd "
               "cocktail_sgd:sparse cocktail_sgd:sparse-packed local_sgd "
               "decentralized_sgd low_precision_decentralized_sgd moshpit_sgd "
               "async_model_average diloco\n",
               error.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    auto number = [&]() {
      const std::string v = value();
      char* end = nullptr;
      const double d = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0') usage(a + ": not a number: " + v);
      return d;
    };
    if (a == "--data")
      o.data = value();
    else if (a == "--model")
      o.model = value();
    else if (a == "--algorithm")
      o.algorithm = value();
    else if (a == "--epochs")
      o.epochs = static_cast<int>(number());
    else if (a == "--batch")
      o.batch = static_cast<int>(number());
    else if (a == "--lr")
      o.lr = number();
    else if (a == "--momentum")
      o.momentum = number();
    else if (a == "--seed")
      o.seed = static_cast<uint64_t>(number());
    else if (a == "--max-steps")
      o.max_steps = static_cast<int64_t>(number());
    else if (a == "--evals-per-epoch")
      o.evals_per_epoch = static_cast<int>(number());
    else if (a == "--threads")
      o.threads = static_cast<int>(number());
    else if (a == "--json")
      o.json = value();
    else if (a == "--curve")
      o.curve = value();
    else if (a == "--init-out")
      o.init_out = value();
    else if (a == "--transport")
      o.transport = value();
    else if (a == "--elastic")
      o.elastic = true;
    else if (a == "--join")
      o.join = o.elastic = true;
    else if (a == "--join-wait")
      o.join_wait_ms = static_cast<int64_t>(number());
    else if (a == "--compare")
      o.compare = true;
    else if (a == "--ranks")
      o.ranks = static_cast<int>(number());
    else if (a == "--results")
      o.results = value();
    else if (a == "--seeds")
      o.seeds = value();
    else if (a == "--only")
      o.only = value();
    else if (a == "--rate")
      o.rate = number();
    else if (a == "--no-peers")
      o.peers = false;
    else if (a == "--hosts-tool")
      o.hosts_tool = value();
    else if (a == "--peer-script")
      o.peer_script = value();
    else if (a == "--python")
      o.python = value();
    else if (a == "-h" || a == "--help")
      usage("help");
    else
      usage("unknown argument " + a);
  }
  if (o.model != "mlp" && o.model != "cnn") usage("--model must be mlp or cnn");
  if (o.epochs < 1 || o.batch < 1 || o.evals_per_epoch < 1 || o.ranks < 1 || o.threads < 1)
    usage("--epochs, --batch, --evals-per-epoch, --ranks and --threads must be >= 1");
  return o;
}

// ---- models (bench/peers/torch_ddp.py defines the same ones) ---------------

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(784, 256))),
        fc2(register_module("fc2", torch::nn::Linear(256, 128))),
        fc3(register_module("fc3", torch::nn::Linear(128, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(fc1->forward(x.view({x.size(0), 784})));
    return fc3->forward(torch::relu(fc2->forward(x)));
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

struct CnnImpl : torch::nn::Module {
  CnnImpl()
      : conv1(register_module("conv1",
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).padding(1)))),
        conv2(register_module("conv2",
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).padding(1)))),
        fc1(register_module("fc1", torch::nn::Linear(64 * 7 * 7, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1->forward(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2);
    return fc2->forward(torch::relu(fc1->forward(x.flatten(1))));
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Cnn);

// ---- data ------------------------------------------------------------------

// The epoch's sample order, shared with the peer: Fisher-Yates driven by
// splitmix64 seeded with seed * 1000003 + epoch.
std::vector<int64_t> permutation(int64_t n, uint64_t seed, int epoch) {
  uint64_t state = seed * 1000003u + static_cast<uint64_t>(epoch);
  auto next = [&state] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[next() % static_cast<uint64_t>(i + 1)]);
  return p;
}

// Images [first, first + count) of `order` as N x 1 x 28 x 28, normalized
// with Fashion-MNIST's mean and standard deviation, and their labels.
std::pair<torch::Tensor, torch::Tensor> batch(const relaxcc::train::Split& s,
                                              const std::vector<int64_t>& order, int64_t first,
                                              int64_t count) {
  const int64_t pixels = s.rows * s.cols;
  torch::Tensor x = torch::empty({count, 1, s.rows, s.cols});
  torch::Tensor y = torch::empty({count}, torch::kInt64);
  float* xp = x.data_ptr<float>();
  int64_t* yp = y.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t k = order[first + i];
    const uint8_t* src = s.pixels.data() + k * pixels;
    for (int64_t j = 0; j < pixels; ++j)
      xp[i * pixels + j] = (static_cast<float>(src[j]) / 255.0f - 0.2860f) / 0.3530f;
    yp[i] = s.labels[k];
  }
  return {x, y};
}

// Writes `text` to `path` and checks that all of it was written and the
// file closed. Throws InvalidArgument naming the file when that fails (a
// full disk, a missing directory), after removing what a regular file got
// of it, so a run never leaves a truncated file that looks like its output.
void write_checked(const std::string& path, const std::string& text, const char* what) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  RELAXCC_ENFORCE(out.is_open(), InvalidArgument, "relaxcc-train: cannot open '", path,
                  "' to write the ", what);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  if (out) return;
  std::error_code ignored;
  if (fs::is_regular_file(path, ignored)) fs::remove(path, ignored);
  RELAXCC_THROW(InvalidArgument, "relaxcc-train: writing the ", what, " to '", path,
                "' failed: expected ", text.size(), " bytes written and the file closed");
}

relaxcc::AlgorithmPtr make_algorithm(const std::string& name, const Options& o) {
  using namespace relaxcc::algorithms;
  if (name == "gradient_allreduce") return std::make_shared<GradientAllreduce>();
  if (name == "bytegrad") {
    // One rank per host in these runs (RELAXCC_RANKS_PER_NODE=1 locally, one
    // per emulated host in relaxcc-hosts): hierarchical bytegrad is the flat
    // compressed allreduce then, and the flat one runs on the job's
    // communicator, whose bytes the summary counts.
    ByteGradOptions b;
    b.hierarchical = false;
    return std::make_shared<ByteGrad>(b);
  }
  if (name == "qadam") {
    QAdamOptions q;
    q.adam.lr = 1e-3f;     // Adam's rate: qadam owns the step, SGD's --lr is not used
    q.warmup_steps = 100;  // Bagua's default
    // At eps 1e-8 the MLP reached NaN within 10 steps of the warmup's end.
    q.adam.eps = 1e-4f;
    return std::make_shared<QAdam>(q);
  }
  if (name == "cocktail_sgd" || name == "cocktail_sgd:sparse" ||
      name == "cocktail_sgd:sparse-packed") {
    CocktailSgdOptions c =
        name == "cocktail_sgd" ? CocktailSgdOptions{} : CocktailSgdOptions::sparse();
    c.pack_payloads = name == "cocktail_sgd:sparse-packed";
    c.seed = o.seed;
    return std::make_shared<CocktailSgd>(c);
  }
  if (name == "local_sgd") return std::make_shared<LocalSgd>(LocalSgdOptions{.period = 4});
  if (name == "decentralized_sgd") return std::make_shared<DecentralizedSgd>();
  if (name == "low_precision_decentralized_sgd")
    return std::make_shared<LowPrecisionDecentralizedSgd>();
  if (name == "moshpit_sgd") return std::make_shared<MoshpitSgd>();
  if (name == "async_model_average") return std::make_shared<AsyncModelAverage>();
  if (name == "diloco") {
    // DiLoCo's outer Nesterov 0.7 / 0.9, which docs/benchmarks.md's figures
    // were measured with; 500 inner steps are more than an epoch of this demo.
    DilocoOptions d = diloco_paper_options(50);
    return std::make_shared<Diloco>(d);
  }
  usage("unknown algorithm " + name);
}

// Where a run stands: the next step to run (an epoch ends at
// steps_per_epoch), the samples of the epoch's order handed out before it,
// and the schedule, which a newcomer takes from the members.
struct Position {
  int64_t epoch = 0, step = 0, taken = 0;
  int64_t steps_per_epoch = 0, eval_every = 1;
  // The members evaluate after the step in which a newcomer is admitted:
  // the newcomer evaluates with them first.
  int64_t evaluate_first = 0;
};

// The parameters' and buffers' data, then each parameter's SGD momentum
// buffer (a flag, then its data), after the position: the same bytes on
// every member of a synchronous run.
std::vector<uint8_t> save_training_state(const Position& at, torch::nn::Module& model,
                                         torch::optim::SGD& sgd) {
  std::vector<uint8_t> out;
  const auto put = [&out](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  };
  const int64_t fields[] = {at.epoch,           at.step,       at.taken,
                            at.steps_per_epoch, at.eval_every, at.evaluate_first};
  put(fields, sizeof(fields));
  for (const auto& t : model.parameters()) put(t.data_ptr(), t.nbytes());
  for (const auto& t : model.buffers()) put(t.data_ptr(), t.nbytes());
  for (const auto& p : model.parameters()) {
    const auto it = sgd.state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
    const uint8_t has =
        it != sgd.state().end() &&
        static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer().defined();
    put(&has, 1);
    if (has) {
      const torch::Tensor m =
          static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer().contiguous();
      put(m.data_ptr(), m.nbytes());
    }
  }
  return out;
}

void load_training_state(const std::vector<uint8_t>& in, Position& at, torch::nn::Module& model,
                         torch::optim::SGD& sgd) {
  size_t at_byte = 0;
  const auto get = [&](void* p, size_t n) {
    RELAXCC_ENFORCE(at_byte + n <= in.size(), CorruptPayload,
                    "relaxcc-train: the training state received ends at byte ", in.size(),
                    " before its field at byte ", at_byte, " (the members run another model?)");
    std::memcpy(p, in.data() + at_byte, n);
    at_byte += n;
  };
  int64_t fields[6];
  get(fields, sizeof(fields));
  at = Position{fields[0], fields[1], fields[2], fields[3], fields[4], fields[5]};
  torch::NoGradGuard no_grad;
  for (auto& t : model.parameters()) get(t.data_ptr(), t.nbytes());
  for (auto& t : model.buffers()) get(t.data_ptr(), t.nbytes());
  for (const auto& p : model.parameters()) {
    uint8_t has = 0;
    get(&has, 1);
    const std::string key = c10::guts::to_string(p.unsafeGetTensorImpl());
    if (!has) {
      sgd.state().erase(key);
      continue;
    }
    torch::Tensor m = torch::empty_like(p);
    get(m.data_ptr(), m.nbytes());
    auto state = std::make_unique<torch::optim::SGDParamState>();
    state->momentum_buffer(m);
    sgd.state()[key] = std::move(state);
  }
  RELAXCC_ENFORCE(at_byte == in.size(), CorruptPayload,
                  "relaxcc-train: the training state received has ", in.size() - at_byte,
                  " bytes more than this model's (the members run another model?)");
}

template <typename Model>
int train(const Options& o, Model model) {
  using relaxcc::TensorView;
  torch::set_num_threads(o.threads);
  relaxcc::torch::DdpOptions ddp_options;
  relaxcc::CommunicatorPtr world;
  // Loaded first: a newcomer is ready for its admission when it asks.
  const relaxcc::train::FashionMnist data = relaxcc::train::load_fashion_mnist(o.data);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(o.lr).momentum(o.momentum));
  Position start;  // where this process's loop starts (a newcomer: the members' next step)
  Position next;   // the step after the one in progress, for the newcomers
  if (o.elastic) {
    RELAXCC_ENFORCE(o.transport == "ucx", InvalidArgument,
                    "relaxcc-train: --elastic needs --transport ucx (a view change creates a UCX "
                    "communicator on the rendezvous store)");
    // The rendezvous store stays open for the agreements on later views.
    relaxcc::UcxCommunicatorOptions u;
    relaxcc::ElasticOptions e;
    if (o.join) {
      // A client of the running job's store: rank and size come with the
      // admission.
      relaxcc::TcpStoreOptions so;
      so.host = u.rendezvous.host;
      so.port = u.rendezvous.port;
      so.timeout = u.rendezvous.timeout;
      u.store = std::make_shared<relaxcc::TcpStore>(so);
    } else {
      u.store = relaxcc::open_rendezvous_store(u.rendezvous);
    }
    e.view_change.store = u.store;
    e.view_change.job = u.rendezvous.job + "/elastic";
    if (o.join) {
      relaxcc::ViewChangeResult admitted =
          relaxcc::join(e.view_change, std::chrono::milliseconds(o.join_wait_ms));
      world = std::move(admitted.comm);
      e.view = std::move(admitted.view);
      e.newcomer = true;
      std::fprintf(stderr, "relaxcc-train: admitted to %s as rank %d\n", e.view.describe().c_str(),
                   world->rank());
    } else {
      world = relaxcc::create_ucx_communicator(u);
      for (int m = 0; m < world->size(); ++m) e.view.members.push_back(m);
    }
    e.admit = true;
    e.save_state = [&] { return save_training_state(next, *model, sgd); };
    e.load_state = [&](const std::vector<uint8_t>& bytes) {
      load_training_state(bytes, start, *model, sgd);
    };
    ddp_options.reducer.elastic = e;
  } else {
    world = relaxcc::create_communicator(o.transport);
  }
  // Counts what the algorithm's groups and splits send too (on the first
  // view's communicator).
  const auto counter = std::make_shared<relaxcc::TrafficCounter>(world);
  if (!o.join) {
    const int64_t global_batch = static_cast<int64_t>(o.batch) * world->size();
    start.steps_per_epoch = data.train.count / global_batch;
    if (o.max_steps > 0) start.steps_per_epoch = std::min(start.steps_per_epoch, o.max_steps);
    start.eval_every = std::max<int64_t>(1, start.steps_per_epoch / o.evals_per_epoch);
  }

  // A newcomer's construction loads the members' state into `start`.
  relaxcc::torch::DistributedDataParallel ddp(counter, *model, sgd, make_algorithm(o.algorithm, o),
                                              ddp_options);
  const int64_t steps_per_epoch = start.steps_per_epoch;
  const int64_t eval_every = start.eval_every;
  // The communicator of the current view (elastic: the survivors'), its
  // rank and size.
  const auto comm = [&ddp] { return ddp.communicator(); };
  const int rank0 = comm()->rank();

  if (rank0 == 0 && !o.init_out.empty()) {
    // The initial weights (rank 0's, now every rank's) for the peer, as f32
    // in parameter order.
    std::string weights;
    for (const auto& p : model->parameters())
      weights.append(static_cast<const char*>(p.data_ptr()), p.nbytes());
    write_checked(o.init_out, weights, "initial weights (--init-out)");
  }

  auto all_sum = [&](double v) {
    auto box = std::make_shared<double>(v);
    comm()->allreduce(TensorView::host(box.get(), 1, box), relaxcc::ExecContext::host())->wait();
    return *box;
  };
  // Exact average of the models, then the test set split across ranks.
  auto evaluate = [&] {
    double correct = 0;
    ddp.with_averaged_model([&] {
      torch::NoGradGuard no_grad;
      model->eval();
      std::vector<int64_t> order(static_cast<size_t>(data.test.count));
      for (int64_t i = 0; i < data.test.count; ++i) order[i] = i;
      const int rank = comm()->rank(), ranks = comm()->size();
      const int64_t per = (data.test.count + ranks - 1) / ranks;
      const int64_t first = std::min<int64_t>(data.test.count, rank * per);
      const int64_t count = std::min<int64_t>(data.test.count - first, per);
      for (int64_t at = 0; at < count; at += 1000) {
        auto [x, y] = batch(data.test, order, first + at, std::min<int64_t>(1000, count - at));
        correct += model->forward(x).argmax(1).eq(y).sum().template item<int64_t>();
      }
      model->train();
    });
    return all_sum(correct) / static_cast<double>(data.test.count);
  };

  struct Point {
    double wall_s, bytes, accuracy;
  };
  std::vector<Point> curve;
  std::vector<double> step_ms;
  double train_s = 0;
  uint64_t bytes = 0;  // sent by this rank while training
  // An evaluation and the bytes sent so far (collective).
  const auto record = [&] {
    const double accuracy = evaluate();
    curve.push_back({train_s, all_sum(static_cast<double>(bytes)) / comm()->size(), accuracy});
  };
  // A newcomer's curve starts at its first evaluation with the members.
  if (!o.join) curve.push_back({0, 0, evaluate()});
  if (start.evaluate_first != 0) record();
  double loss_sum = 0;
  int64_t loss_count = 0;
  for (int epoch = static_cast<int>(start.epoch); epoch < o.epochs; ++epoch) {
    const std::vector<int64_t> order = permutation(data.train.count, o.seed, epoch);
    // Samples of `order` handed out so far: each step takes a batch per
    // member of the view its backward ends on (an epoch keeps its number of
    // steps; after a view change it covers fewer or more samples, none
    // twice).
    const bool resumed = epoch == start.epoch;
    int64_t taken = resumed ? start.taken : 0;
    // The epoch ends after steps_per_epoch steps, or earlier when the
    // samples left do not make a batch per member (after newcomers came).
    const auto fits = [&](int64_t at) {
      return at + comm()->size() * static_cast<int64_t>(o.batch) <= data.train.count;
    };
    for (int64_t s = resumed ? start.step : 0; s < steps_per_epoch && fits(taken); ++s) {
      const uint64_t sent0 = counter->bytes_sent();
      const auto t0 = Clock::now();
      const int size0 = comm()->size();
      auto [x, y] = batch(data.train, order, taken + comm()->rank() * o.batch, o.batch);
      sgd.zero_grad();
      torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      loss.backward();
      const int size1 = comm()->size();  // the view the step's backward ended on
      taken += size1 * static_cast<int64_t>(o.batch);
      // Decided on the view the backward ended on, the same on every
      // member, and handed to the newcomers admitted at the step's end.
      const bool last = s + 1 == steps_per_epoch || !fits(taken);
      const bool evaluates = (s + 1) % eval_every == 0 || last;
      next = !last ? Position{epoch, s + 1, taken, steps_per_epoch, eval_every, evaluates}
                   : Position{epoch + 1, 0, 0, steps_per_epoch, eval_every, evaluates};
      ddp.step();  // newcomers may be admitted at its end
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      bytes += counter->bytes_sent() - sent0;
      train_s += ms / 1e3;
      if (comm()->rank() == 0 && size1 < size0)
        std::fprintf(stderr,
                     "\nrelaxcc-train: step %lld went on without lost members: %s, the step "
                     "took %.0f ms\n",
                     static_cast<long long>(s), ddp.reducer().view().describe().c_str(), ms);
      if (comm()->rank() == 0 && comm()->size() > size1)
        std::fprintf(stderr,
                     "\nrelaxcc-train: newcomers admitted after step %lld: %s, the step took "
                     "%.0f ms\n",
                     static_cast<long long>(s), ddp.reducer().view().describe().c_str(), ms);
      step_ms.push_back(ms);
      loss_sum += loss.template item<float>();
      ++loss_count;
      if (comm()->rank() == 0 && (s % std::max<int64_t>(1, steps_per_epoch / 50) == 0 || last)) {
        const int width = 30;
        const int filled = static_cast<int>(width * (s + 1) / steps_per_epoch);
        std::fprintf(stderr, "\r%s epoch %d/%d [%s%s] %lld/%lld loss %.4f", o.algorithm.c_str(),
                     epoch + 1, o.epochs, std::string(filled, '#').c_str(),
                     std::string(width - filled, '.').c_str(), static_cast<long long>(s + 1),
                     static_cast<long long>(steps_per_epoch), loss_sum / loss_count);
        loss_sum = 0;
        loss_count = 0;
      }
      if (evaluates) record();
    }
    if (comm()->rank() == 0) std::fprintf(stderr, "  test accuracy %.4f\n", curve.back().accuracy);
  }
  ddp.finish();
  if (o.elastic) {
    // Every process's model, comparable across processes (a synchronous
    // algorithm keeps them bit-identical, newcomers included).
    relaxcc::Fnv1a h;
    for (const auto& p : model->parameters())
      h.bytes(std::string_view(static_cast<const char*>(p.data_ptr()), p.nbytes()));
    std::fprintf(stderr, "relaxcc-train: %s: model hash %llu\n",
                 ddp.reducer().view().describe().c_str(),
                 static_cast<unsigned long long>(h.value()));
  }

  // Median step time after 10 warm-up steps.
  std::vector<double> steady(step_ms.begin() + std::min<size_t>(10, step_ms.size() / 2),
                             step_ms.end());
  std::sort(steady.begin(), steady.end());
  const double median = steady.empty() ? 0.0 : steady[steady.size() / 2];
  // The job's step time is the slowest rank's median.
  auto box = std::make_shared<double>(median);
  relaxcc::AllreduceOptions mx;
  mx.op = relaxcc::ReduceOp::max;
  comm()->allreduce(TensorView::host(box.get(), 1, box), relaxcc::ExecContext::host(), mx)->wait();
  const double step = *box;
  const int rank = comm()->rank(), ranks = comm()->size();
  // A newcomer admitted after the last evaluation has none.
  const Point last = curve.empty() ? Point{0, 0, 0} : curve.back();
  const double wall = last.wall_s;
  const double bytes_per_rank = last.bytes;
  const double accuracy = last.accuracy;
  if (rank == 0) {
    std::printf(
        "relaxcc-train %s %s: %d ranks, %d epochs, %lld steps: test accuracy %.4f, wall %.2f s, "
        "step %.2f ms (median), %.1f MB sent per rank%s\n",
        o.algorithm.c_str(), o.model.c_str(), ranks, o.epochs,
        static_cast<long long>(step_ms.size()), accuracy, wall, step, bytes_per_rank / 1e6,
        o.elastic ? (", view " + ddp.reducer().view().describe()).c_str() : "");
    if (!o.json.empty()) {
      std::ostringstream j;
      j << "{\"algorithm\": \"" << o.algorithm << "\", \"model\": \"" << o.model
        << "\", \"ranks\": " << ranks << ", \"epochs\": " << o.epochs << ", \"seed\": " << o.seed
        << ", \"steps\": " << step_ms.size() << ", \"test_accuracy\": " << accuracy
        << ", \"wall_s\": " << wall << ", \"step_ms\": " << step
        << ", \"bytes_sent_per_rank\": " << static_cast<uint64_t>(bytes_per_rank)
        << ", \"view_epoch\": " << ddp.reducer().view().epoch << "}\n";
      write_checked(o.json, j.str(), "JSON summary (--json)");
    }
    if (!o.curve.empty()) {
      std::ostringstream c;
      c << "# wall_s bytes_sent_per_rank test_accuracy\n";
      for (const Point& p : curve) c << p.wall_s << " " << p.bytes << " " << p.accuracy << "\n";
      write_checked(o.curve, c.str(), "accuracy curve (--curve)");
    }
  }
  return 0;
}

// ---- --compare -------------------------------------------------------------

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// A number field of a flat JSON object written by a run, or nullopt when
// the field is missing or not a number.
std::optional<double> json_number(const std::string& text, const std::string& key) {
  const std::string field = "\"" + key + "\":";
  const size_t at = text.find(field);
  if (at == std::string::npos) return std::nullopt;
  const char* begin = text.c_str() + at + field.size();
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  if (end == begin) return std::nullopt;
  return v;
}

int run(const std::string& command) {
  std::fprintf(stderr, "+ %s\n", command.c_str());
  const int status = std::system(command.c_str());
  if (status == -1) return 127;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

// One algorithm (or peer) over the seeds: what the runs that succeeded
// measured, and the seeds whose run failed.
struct Row {
  std::string name;
  std::vector<std::string> seeds;  // that succeeded, in the order of --seeds
  std::vector<double> accuracy, wall, step, bytes;
  std::vector<std::string> missing;  // seeds whose run failed
};

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}
double spread(const std::vector<double>& v) {
  if (v.empty()) return 0;
  return *std::max_element(v.begin(), v.end()) - *std::min_element(v.begin(), v.end());
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

// Reads the summary a run wrote into `out` (test_accuracy, wall_s, step_ms,
// bytes_sent_per_rank); returns what is wrong with it, empty when nothing.
std::string read_summary(const std::string& path, std::vector<double>& out) {
  std::ifstream in(path);
  if (!in.is_open()) return "it wrote no summary '" + path + "'";
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.find('}') == std::string::npos)
    return "its summary '" + path + "' is incomplete (" + std::to_string(text.size()) +
           " bytes, no closing brace)";
  out.clear();
  for (const char* key : {"test_accuracy", "wall_s", "step_ms", "bytes_sent_per_rank"}) {
    const std::optional<double> v = json_number(text, key);
    if (!v) return "its summary '" + path + "' has no number \"" + key + "\"";
    out.push_back(*v);
  }
  return "";
}

// The highest accuracy in a curve file (wall seconds, bytes, accuracy per
// line); nullopt when it holds none.
std::optional<double> best_in_curve(const std::string& path) {
  std::ifstream in(path);
  std::optional<double> best;
  double wall = 0, bytes = 0, accuracy = 0;
  while (in >> wall >> bytes >> accuracy)
    if (!best || accuracy > *best) best = accuracy;
  return best;
}

// The gnuplot script of the two plots: each row's curve of its first seed
// that succeeded (the title names the seed when it is not the first of
// --seeds), every series with its own colour and point shape, the accuracy
// axis from a little below the lowest final accuracy of the plotted curves
// to a little above the highest accuracy any of them reached, and
// torch_ddp's final accuracy (of its plotted seed) as a dashed line in the
// key.
std::string plot_script(const std::string& dir, const std::vector<Row>& rows,
                        const std::string& first_seed) {
  // 14 colours and 13 point shapes: no two of the first 182 series look alike.
  static const char* const colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                        "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22",
                                        "#000080", "#800000", "#008080", "#000000"};
  static const int shapes[] = {7, 5, 9, 11, 13, 15, 6, 4, 8, 10, 12, 14, 2};
  double lowest_final = 1, highest = 0;
  const Row* ddp = nullptr;
  for (const Row& r : rows) {
    if (r.seeds.empty()) continue;
    const double final_accuracy = r.accuracy.front();  // the plotted seed's
    lowest_final = std::min(lowest_final, final_accuracy);
    highest = std::max(highest, final_accuracy);
    if (const std::optional<double> best =
            best_in_curve(dir + "/" + r.name + ".seed" + r.seeds.front() + ".dat"))
      highest = std::max(highest, *best);
    if (r.name == "torch_ddp") ddp = &r;
  }
  const double pad = std::max(0.005, 0.1 * (highest - lowest_final));
  std::ostringstream gp;
  gp << "set terminal pngcairo size 1100,650 noenhanced\nset key outside right top\nset grid\n"
        "set ylabel 'test accuracy'\nset yrange ["
     << std::max(0.0, lowest_final - pad) << ":" << std::min(1.0, highest + pad) << "]\n";
  // torch_ddp's final accuracy: a dashed horizontal line with its own key entry.
  std::string ddp_line;
  if (ddp) {
    char value[32];
    std::snprintf(value, sizeof value, "%.4f", ddp->accuracy.front());
    ddp_line = std::string(", ") + value +
               " with lines dashtype 2 linewidth 2 linecolor rgb '#404040' title 'torch_ddp final" +
               (ddp->seeds.front() == first_seed ? "" : " (seed " + ddp->seeds.front() + ")") +
               ": " + value + "'";
  }
  auto plot = [&](const std::string& file, const std::string& xlabel, const std::string& using_) {
    gp << "set output '" << dir << "/" << file << "'\nset xlabel '" << xlabel << "'\nplot ";
    size_t i = 0;
    for (const Row& r : rows) {
      if (r.seeds.empty()) continue;
      const std::string& seed = r.seeds.front();
      gp << (i ? ", " : "") << "'" << dir << "/" << r.name << ".seed" << seed << ".dat' using "
         << using_ << " with linespoints linewidth 1.5 linecolor rgb '"
         << colours[i % std::size(colours)] << "' pointtype " << shapes[i % std::size(shapes)]
         << " pointsize 1.2 title '" << r.name << (seed == first_seed ? "" : " (seed " + seed + ")")
         << "'";
      ++i;
    }
    gp << ddp_line << "\n";
  };
  plot("accuracy_vs_time.png", "wall time (s, training only)", "1:3");
  plot("accuracy_vs_bytes.png", "MB sent per rank", "($2/1e6):3");
  return gp.str();
}

// Runs every algorithm (and peer) for every seed, one run after the other.
// Exits 0 only when every run succeeded and wrote its summary; a failed run
// is left out of its row's mean, and the table names its seed.
int compare(const Options& o, const char* self) {
  fs::create_directories(o.results);
  const std::string dir = fs::absolute(o.results).string();
  std::vector<std::string> names = kAlgorithms;
  if (o.peers) names.insert(names.end(), kPeers.begin(), kPeers.end());
  if (!o.only.empty()) names = split_list(o.only);
  const std::vector<std::string> seeds = split_list(o.seeds);
  if (seeds.empty()) usage("--seeds lists no seed");
  const std::string shared = " --model " + o.model + " --epochs " + std::to_string(o.epochs) +
                             " --batch " + std::to_string(o.batch) + " --lr " +
                             std::to_string(o.lr) + " --momentum " + std::to_string(o.momentum) +
                             " --max-steps " + std::to_string(o.max_steps) + " --evals-per-epoch " +
                             std::to_string(o.evals_per_epoch) + " --threads " +
                             std::to_string(o.threads) + " --data " + o.data;
  const std::string n = std::to_string(o.ranks);
  const std::string rate = std::to_string(static_cast<int>(o.rate));
  // Each rank runs under env, which sets OPENBLAS_NUM_THREADS=1 in the rank's
  // own environment, whatever the launcher forwards (relaxcc-hosts forwards
  // only RELAXCC_* variables, and sets RELAXCC_RANKS_PER_NODE per host).
  const std::string mpirun =
      (o.rate > 0 ? o.hosts_tool + " mpirun --hosts " + n + " --rate " + rate + " -- "
                  : "RELAXCC_RANKS_PER_NODE=1 mpirun -n " + n +
                        " --oversubscribe --bind-to none -x RELAXCC_RANKS_PER_NODE ") +
      "/usr/bin/env OPENBLAS_NUM_THREADS=1 ";
  std::vector<Row> rows;
  std::vector<std::string> failures;  // "name (seed s): why"
  for (const std::string& name : names) {
    Row row{name, {}, {}, {}, {}, {}, {}};
    for (const std::string& seed : seeds) {
      const std::string stem = dir + "/" + name + ".seed" + seed;
      const std::string init = dir + "/init_" + o.model + ".seed" + seed + ".f32";
      const bool peer = name.rfind("torch_ddp", 0) == 0;
      // A summary or curve of an earlier run must never stand for this one.
      for (const char* ext : {".json", ".dat"}) {
        std::error_code error;
        fs::remove(stem + ext, error);
        if (error) {
          std::fprintf(stderr, "relaxcc-train --compare: cannot remove the stale '%s%s': %s\n",
                       stem.c_str(), ext, error.message().c_str());
          return 1;
        }
      }
      std::string cmd;
      if (!peer) {
        cmd = mpirun + self + " --algorithm " + name + shared + " --seed " + seed + " --json " +
              stem + ".json --curve " + stem + ".dat --init-out " + init;
      } else {
        const std::string launcher =
            o.rate > 0 ? o.hosts_tool + " exec --hosts " + n + " --rate " + rate + " -- "
                       : "mpirun -n " + n + " --oversubscribe --bind-to none ";
        // A port of this run's own, so a socket of the last run in TIME_WAIT
        // never collides.
        const int port =
            20000 +
            static_cast<int>((::getpid() * 7 + rows.size() * 131 + std::stoi(seed)) % 20000);
        cmd = "OPENBLAS_NUM_THREADS=1 timeout 1800 " + launcher + o.python + " " + o.peer_script +
              " --variant " + name + shared + " --seed " + seed + " --init " + init + " --port " +
              std::to_string(port) + " --json " + stem + ".json --curve " + stem + ".dat";
      }
      std::string why;
      std::vector<double> summary;
      if (const int rc = run(cmd); rc != 0)
        why = "exit " + std::to_string(rc);
      else if (const std::string wrong = read_summary(stem + ".json", summary); !wrong.empty())
        why = "exit 0, but " + wrong;
      if (!why.empty()) {
        std::fprintf(stderr, "relaxcc-train --compare: %s (seed %s) failed (%s); left out\n",
                     name.c_str(), seed.c_str(), why.c_str());
        failures.push_back(name + " (seed " + seed + "): " + why);
        row.missing.push_back(seed);
        continue;
      }
      row.seeds.push_back(seed);
      row.accuracy.push_back(summary[0]);
      row.wall.push_back(summary[1]);
      row.step.push_back(summary[2]);
      row.bytes.push_back(summary[3]);
    }
    rows.push_back(row);
  }

  // The table: ratios against gradient_allreduce and torch_ddp of this run.
  auto find = [&](const std::string& name) -> const Row* {
    for (const Row& r : rows)
      if (r.name == name && !r.accuracy.empty()) return &r;
    return nullptr;
  };
  const Row* base = find("gradient_allreduce");
  const Row* peer = find("torch_ddp");
  std::ostringstream t;
  t << "| algorithm | seeds | test accuracy (mean, spread) | wall s | step ms (median) | MB sent "
       "per rank | accuracy - gradient_allreduce | step vs torch_ddp | wall vs torch_ddp |\n"
       "|---|---|---|---|---|---|---|---|---|\n";
  char buf[768];
  for (const Row& r : rows) {
    const std::string covered = (r.seeds.empty() ? std::string("none") : join(r.seeds)) +
                                (r.missing.empty() ? "" : "; missing: " + join(r.missing));
    if (r.accuracy.empty()) {
      t << "| " << r.name << " | " << covered << " | failed | - | - | - | - | - | - |\n";
      continue;
    }
    char delta[32] = "-", step[32] = "-", wall[32] = "-";
    if (base)
      std::snprintf(delta, sizeof delta, "%+.2f pt",
                    100 * (mean(r.accuracy) - mean(base->accuracy)));
    if (peer) {
      std::snprintf(step, sizeof step, "%.2fx", mean(r.step) / mean(peer->step));
      std::snprintf(wall, sizeof wall, "%.2fx", mean(r.wall) / mean(peer->wall));
    }
    std::snprintf(buf, sizeof buf,
                  "| %s | %s | %.4f (%.4f) | %.2f | %.2f | %.2f | %s | %s | %s |\n", r.name.c_str(),
                  covered.c_str(), mean(r.accuracy), spread(r.accuracy), mean(r.wall), mean(r.step),
                  mean(r.bytes) / 1e6, delta, step, wall);
    t << buf;
  }
  if (!failures.empty()) {
    t << "\nFailed runs (left out of the means above):\n\n";
    for (const std::string& f : failures) t << "- " << f << "\n";
  }
  std::ostringstream header;
  header << "# relaxcc-train --compare\n\n"
         << o.ranks << " ranks, model " << o.model << ", " << o.epochs << " epoch(s), batch "
         << o.batch << " per rank, lr " << o.lr << ", momentum " << o.momentum << ", seeds "
         << join(seeds)
         << (o.rate > 0 ? ", links at " + rate + " Mbit/s (relaxcc-hosts)" : ", one machine")
         << (o.max_steps > 0 ? ", at most " + std::to_string(o.max_steps) + " steps per epoch" : "")
         << ". Wall time excludes evaluation; step time is the median after 10 steps, slowest "
            "rank; bytes are what each rank's communicator and the groups and splits made from "
            "it sent (torch_ddp rows: the bytes of its allreduces, counted by the peer). Means and "
            "spreads are over the seeds column's "
            "seeds; a missing seed's run failed (see the list below the table).\n\n";
  bool table_written = true;
  try {
    write_checked(dir + "/table.md", header.str() + t.str(), "comparison table");
  } catch (const relaxcc::InvalidArgument& e) {
    std::fprintf(stderr, "relaxcc-train --compare: %s\n", e.what());
    table_written = false;
  }
  std::printf("%s%s", header.str().c_str(), t.str().c_str());

  const bool any =
      std::any_of(rows.begin(), rows.end(), [](const Row& r) { return !r.seeds.empty(); });
  if (any) {
    std::ofstream(dir + "/plots.gp") << plot_script(dir, rows, seeds.front());
    if (run("gnuplot " + dir + "/plots.gp") != 0)
      std::fprintf(stderr, "relaxcc-train --compare: gnuplot failed; no plots\n");
  } else {
    std::fprintf(stderr, "relaxcc-train --compare: no run succeeded; no plots\n");
  }
  std::printf("results in %s: table.md, accuracy_vs_time.png, accuracy_vs_bytes.png\n",
              dir.c_str());
  if (!failures.empty())
    std::fprintf(stderr, "relaxcc-train --compare: %zu of %zu runs failed: %s\n", failures.size(),
                 names.size() * seeds.size(), join(failures).c_str());
  return failures.empty() && table_written ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    if (o.compare) {
      char self[4096];
      const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
      if (n <= 0) throw std::runtime_error("cannot find this program's path");
      self[n] = '\0';
      return compare(o, self);
    }
    torch::manual_seed(o.seed);  // the initial weights (rank 0's are broadcast)
    return o.model == "cnn" ? train(o, Cnn()) : train(o, Mlp());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "relaxcc-train: %s\n", e.what());
    return 1;
  }
}
