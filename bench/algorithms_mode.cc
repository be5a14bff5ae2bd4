// `relaxcc-bench algorithms`: every algorithm module on one synthetic model
// (ResNet-50's 161 tensors, 25.6M f32 parameters), each step a backward whose
// compute is emulated by sleeping (compute_ms spread over the layers in
// proportion to their size, gradients marked ready as their layer finishes),
// then the optimizer step (SGD, or the algorithm's own). Algorithms run one
// after the other in the same run; gradient_allreduce first, as the baseline
// of every ratio.
//
// Per algorithm: step_ms is the mean step time over the timed steps (a
// periodic algorithm's communicating steps count in proportion), the
// maximum over ranks; bytes_per_step is what each rank's transport sent on
// the algorithm's communicator per timed step (CommStats::bytes_sent, mean
// over ranks): payloads, headers and indices included, TCP/IP headers not.
// Hierarchical modes run on communicators of their own, whose bytes that
// counter does not see, so bytegrad runs flat here (with one rank per
// emulated host, the hierarchy would be the flat schedule anyway).
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "model_layers.h"
#include "modes.h"
#include "relaxcc/algorithms/async_model_average.h"
#include "relaxcc/algorithms/bytegrad.h"
#include "relaxcc/algorithms/cocktail_sgd.h"
#include "relaxcc/algorithms/decentralized_sgd.h"
#include "relaxcc/algorithms/diloco.h"
#include "relaxcc/algorithms/gradient_allreduce.h"
#include "relaxcc/algorithms/local_sgd.h"
#include "relaxcc/algorithms/low_precision_decentralized_sgd.h"
#include "relaxcc/algorithms/moshpit_sgd.h"
#include "relaxcc/algorithms/qadam.h"
#include "relaxcc/errors.h"
#include "relaxcc/mpi_communicator.h"
#include "relaxcc/reducer.h"
#include "report.h"

namespace relaxcc::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct AlgorithmsArgs {
  std::string model = "resnet50";
  std::vector<std::string> algorithms{"gradient_allreduce", "bytegrad",           "qadam",
                                      "cocktail_sgd",       "cocktail_sgd:paper", "local_sgd"};
  double compute_ms = 200;
  double rate_mbit = 0;  // recorded in the rows (the harness's link rate; 0: unshaped)
  int iters = 8, warmup = 2;
  std::string json;
};

// The model: each layer a gradient and its parameter.
struct Model {
  std::vector<Layer> layers;
  std::vector<std::vector<float>> grads, params;
  std::vector<TensorSpec> specs;
  int64_t total = 0;

  Model(const std::string& name, int rank) : layers(model_layers(name)) {
    for (size_t i = 0; i < layers.size(); ++i) {
      const auto n = static_cast<size_t>(layers[i].numel);
      grads.emplace_back(n);
      params.emplace_back(n, 0.01f);
      total += layers[i].numel;
    }
    for (size_t i = 0; i < layers.size(); ++i) {
      specs.push_back({layers[i].name + ".grad", TensorView::host(grads[i].data(), layers[i].numel),
                       TensorRole::gradient, static_cast<int>(2 * i + 1)});
      specs.push_back({layers[i].name, TensorView::host(params[i].data(), layers[i].numel),
                       TensorRole::parameter});
    }
    fill_gradients(rank, 0);
  }
  // Gradients of varied magnitude (a top-k has something to choose), a
  // different pattern per rank and step.
  void fill_gradients(int rank, int64_t step) {
    uint64_t h = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank * 1009 + step + 1);
    for (auto& g : grads)
      for (float& v : g) {
        h ^= h << 13;
        h ^= h >> 7;
        h ^= h << 17;
        v = static_cast<float>(static_cast<int64_t>(h % 2001) - 1000) * 1e-6f;
      }
  }
};

// One step: layer i (last first) is done once its share of compute_ms,
// in proportion to its size, has passed (sleeping), and its gradient is
// marked ready then; then the optimizer step.
void train_step(Reducer& reducer, const Model& model, double compute_ms, Optimizer& optimizer) {
  reducer.begin_step();
  const auto start = Clock::now();
  int64_t done = 0;  // parameters of the layers computed so far
  for (int i = static_cast<int>(model.layers.size()) - 1; i >= 0; --i) {
    done += model.layers[i].numel;
    const double fraction = static_cast<double>(done) / static_cast<double>(model.total);
    std::this_thread::sleep_until(
        start + std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double, std::milli>(compute_ms * fraction)));
    reducer.mark_ready(2 * i);
  }
  reducer.synchronize();
  reducer.optimizer_step(optimizer);
}

// "name" or "name:setting".
AlgorithmPtr make_algorithm(const std::string& spec, std::string* setting) {
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  *setting = colon == std::string::npos ? "defaults" : spec.substr(colon + 1);
  const bool defaults = *setting == "defaults";
  if (name == "gradient_allreduce" && defaults)
    return std::make_shared<algorithms::GradientAllreduce>();
  if (name == "bytegrad" && defaults) {
    algorithms::ByteGradOptions o;
    o.hierarchical = false;
    *setting = "8-bit, flat";
    return std::make_shared<algorithms::ByteGrad>(o);
  }
  if (name == "qadam" && defaults) {
    algorithms::QAdamOptions o;
    o.warmup_steps = 0;  // every timed step compressed
    *setting = "8-bit min-max, after warmup";
    return std::make_shared<algorithms::QAdam>(o);
  }
  if (name == "cocktail_sgd" && defaults) return std::make_shared<algorithms::CocktailSgd>();
  if (name == "cocktail_sgd" && *setting == "paper") {
    algorithms::CocktailSgdOptions o;
    o.random_ratio = 0.1;
    o.topk_ratio = 0.2;
    o.bits = 4;
    *setting = "paper: p 0.1, top-k 0.2, 4-bit";
    return std::make_shared<algorithms::CocktailSgd>(o);
  }
  if (name == "local_sgd" && defaults) return std::make_shared<algorithms::LocalSgd>();
  if (name == "decentralized_sgd" && (defaults || *setting == "shift_one")) {
    algorithms::DecentralizedSgdOptions o;
    if (!defaults) o.mode = GossipMode::shift_one;
    *setting = defaults ? "mode all" : "mode shift_one";
    return std::make_shared<algorithms::DecentralizedSgd>(o);
  }
  if (name == "low_precision_decentralized_sgd" && defaults) {
    *setting = "ring, 8-bit min-max";
    return std::make_shared<algorithms::LowPrecisionDecentralizedSgd>();
  }
  if (name == "moshpit_sgd" && defaults) {
    *setting = "grid, adaptive deadline";
    return std::make_shared<algorithms::MoshpitSgd>();
  }
  if (name == "async_model_average" && defaults)
    return std::make_shared<algorithms::AsyncModelAverage>();
  // diloco:h<H>[-4bit][-streaming][-eager]: H inner steps (defaults: 500),
  // 4-bit min-max pseudo-gradients with error feedback, 4 streaming
  // fragments, one-round-delayed outer steps.
  if (name == "diloco") {
    algorithms::DilocoOptions o;
    if (!defaults) {
      RELAXCC_ENFORCE(setting->size() > 1 && (*setting)[0] == 'h', InvalidArgument,
                      "algorithms: diloco's setting is h<H>[-4bit][-streaming][-eager], got '",
                      *setting, "'");
      o.inner_steps = std::stoi(setting->substr(1));
      if (setting->find("-4bit") != std::string::npos) {
        o.codec = kernels::CompressorConfig{};
        o.codec->bits = 4;
      }
      if (setting->find("-streaming") != std::string::npos) o.fragments = 4;
      o.eager = setting->find("-eager") != std::string::npos;
    }
    return std::make_shared<algorithms::Diloco>(o);
  }
  RELAXCC_THROW(InvalidArgument, "algorithms: unknown algorithm '", spec,
                "' (gradient_allreduce, bytegrad, qadam, cocktail_sgd, cocktail_sgd:paper, "
                "local_sgd, decentralized_sgd, decentralized_sgd:shift_one, "
                "low_precision_decentralized_sgd, moshpit_sgd, async_model_average, diloco, "
                "diloco:h<H>[-4bit][-streaming][-eager])");
}

void run_algorithms(const AlgorithmsArgs& args) {
  BenchWorld world;
  Report report(world.rank == 0, args.json);
  MpiCommunicatorOptions mo;
  mo.tunables = world.tunables;
  CommunicatorPtr comm = create_mpi_communicator(mo);
  Model model(args.model, world.rank);
  report.print(detail::concat(
      "# relaxcc-bench algorithms: ", world.size, " ranks, ", args.model, " (", model.total,
      " f32 parameters), compute ", args.compute_ms, " ms per step (sleep), link ",
      args.rate_mbit > 0 ? std::to_string(args.rate_mbit) + " Mbit/s" : std::string("unshaped"),
      "; mean step time (max over ranks), bytes sent per rank and step"));
  char line[400];
  std::snprintf(line, sizeof line, "%-20s %-32s %12s %10s %12s %10s %10s", "algorithm", "setting",
                "bytes/step", "bytes_x", "step(ms)", "step_x", "median");
  report.print(line);
  double base_bytes = 0, base_ms = 0;
  for (const std::string& spec : args.algorithms) {
    std::string setting;
    AlgorithmPtr algorithm = make_algorithm(spec, &setting);
    const std::string name = algorithm->name();
    Reducer reducer(comm, model.specs, algorithm, ExecContext::host());
    Sgd sgd(SgdOptions{1e-3f});
    std::vector<double> times;
    uint64_t sent0 = 0;
    for (int i = 0; i < args.warmup + args.iters; ++i) {
      model.fill_gradients(world.rank, i);
      if (i == args.warmup) {
        algorithm->drain(std::chrono::minutes(5));
        sent0 = comm->stats().bytes_sent;
      }
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = Clock::now();
      train_step(reducer, model, args.compute_ms, sgd);
      if (i >= args.warmup)
        times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    algorithm->shutdown(std::chrono::minutes(5));
    const uint64_t sent = comm->stats().bytes_sent - sent0;
    double mean = 0;
    for (double t : times) mean += t;
    mean /= static_cast<double>(times.size());
    const double step_ms = world.max_over_ranks(mean);
    const double median_ms = world.max_over_ranks(median(times));
    const double bytes = static_cast<double>(world.sum_over_ranks(static_cast<int64_t>(sent))) /
                         world.size / args.iters;
    if (name == "gradient_allreduce" && base_bytes == 0) {
      base_bytes = bytes;
      base_ms = step_ms;
    }
    const double bytes_ratio = base_bytes > 0 && bytes > 0 ? base_bytes / bytes : 0;
    const double step_ratio = base_ms > 0 ? step_ms / base_ms : 0;
    std::snprintf(line, sizeof line, "%-20s %-32s %12.0f %10.2f %12.1f %10.3f %10.1f", name.c_str(),
                  setting.c_str(), bytes, bytes_ratio, step_ms, step_ratio, median_ms);
    report.print(line);
    report.add(Row()
                   .set("mode", "algorithms")
                   .set("algorithm", name)
                   .set("setting", setting)
                   .set("model", args.model)
                   .set("params", model.total)
                   .set("ranks", world.size)
                   .set("bytes_per_step", bytes)
                   .set("step_ms", step_ms)
                   .set("step_ms_median", median_ms)
                   .set("bytes_ratio_vs_allreduce", bytes_ratio)
                   .set("step_ratio_vs_allreduce", step_ratio)
                   .set("compute_ms", args.compute_ms)
                   .set("rate_mbit", args.rate_mbit)
                   .set("iters", args.iters));
  }
}

}  // namespace

void add_algorithms_mode(CLI::App& app) {
  auto args = std::make_shared<AlgorithmsArgs>();
  CLI::App* sub = app.add_subcommand(
      "algorithms", "Bytes and time per step of every algorithm module on a synthetic model");
  sub->add_option("--model", args->model, "resnet50 or bert-base")->capture_default_str();
  sub->add_option("--algorithms", args->algorithms,
                  "Algorithms in order (name or name:setting); bytes_x and step_x are against the "
                  "first gradient_allreduce")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--compute-ms", args->compute_ms, "Emulated backward compute per step (sleep)")
      ->capture_default_str();
  sub->add_option("--rate-mbit", args->rate_mbit,
                  "Link rate recorded in the JSON rows (relaxcc-hosts --rate; 0: unshaped)")
      ->capture_default_str();
  sub->add_option("-n,--iters", args->iters, "Timed steps")->capture_default_str();
  sub->add_option("-w,--warmup_iters", args->warmup, "Untimed steps first")->capture_default_str();
  sub->add_option("--json", args->json, "Append JSON Lines rows to this file");
  sub->callback([args] { run_algorithms(*args); });
}

}  // namespace relaxcc::bench
