// relaxcc::torch::DistributedDataParallel on a small libtorch model under
// mpiexec: gradient_allreduce against single-process training on the
// concatenated batch, no_sync, unused parameters (momentum included), tied
// parameters, buffer broadcast, the exact model average of mixed dtypes,
// checkpoint resumption, uneven inputs and misuse; qadam with the torch
// optimizer's learning rate, a null algorithm, and the one-include header.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "relaxcc/errors.h"
#include "relaxcc/torch/ddp.h"  // every algorithm, and build_description()
#include "test_util.h"

namespace {

using relaxcc::test::world;
using relaxcc::torch::DdpOptions;
using relaxcc::torch::DistributedDataParallel;

constexpr int kIn = 6, kHidden = 16, kOut = 3, kBatch = 8;  // kBatch per rank

// Two linear layers; `spare` is not used in forward (loss_with_spare uses
// it); `norm` (optional) carries batch-norm buffers; with `tied`, fc2 is
// registered a second time, as "fc2_again" (its parameters come last in
// parameters(), twice).
struct NetImpl : torch::nn::Module {
  NetImpl(int hidden, bool with_norm, bool tied = false) {
    fc1 = register_module("fc1", torch::nn::Linear(kIn, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, kOut));
    spare = register_module("spare", torch::nn::Linear(2, 2));
    if (with_norm) norm = register_module("norm", torch::nn::BatchNorm1d(hidden));
    if (tied) register_module("fc2_again", fc2);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = fc1->forward(x);
    if (norm) h = norm->forward(h);
    return fc2->forward(torch::tanh(h));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, spare{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};
TORCH_MODULE(Net);

// The same model on every rank whatever the rank's own random state.
Net make_net(bool with_norm = false, int hidden = kHidden, bool tied = false) {
  torch::manual_seed(42);
  return Net(hidden, with_norm, tied);
}

// The global batch of step `step` (every rank draws the same), and this
// rank's slice of it.
std::pair<torch::Tensor, torch::Tensor> global_batch(int step, int ranks) {
  torch::Generator gen = torch::make_generator<at::CPUGeneratorImpl>(1000 + step);
  torch::Tensor x = torch::randn({kBatch * ranks, kIn}, gen);
  torch::Tensor y = torch::randint(0, kOut, {kBatch * ranks}, gen);
  return {x, y};
}
std::pair<torch::Tensor, torch::Tensor> my_slice(int step, int rank, int ranks) {
  auto [x, y] = global_batch(step, ranks);
  return {x.narrow(0, rank * kBatch, kBatch), y.narrow(0, rank * kBatch, kBatch)};
}

torch::Tensor loss_of(Net& net, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(net->forward(x), y);
}

// The loss plus a term of `spare` on the first two inputs of `spare_x`
// (whose mean over its rows is the term).
torch::Tensor loss_with_spare(Net& net, const torch::Tensor& x, const torch::Tensor& y,
                              const torch::Tensor& spare_x) {
  return loss_of(net, x, y) + 0.1 * net->spare->forward(spare_x.narrow(1, 0, 2)).pow(2).mean();
}

torch::optim::SGD make_sgd_of(torch::nn::Module& m) {
  return torch::optim::SGD(m.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
}
torch::optim::SGD make_sgd(Net& net) {
  return make_sgd_of(*net);
}

std::vector<torch::Tensor> snapshot(Net& net) {
  std::vector<torch::Tensor> out;
  for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

// Largest absolute difference between two parameter lists.
float max_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, (a[i] - b[i]).abs().max().item<float>());
  return d;
}

bool bitwise_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

relaxcc::AlgorithmPtr allreduce() {
  return std::make_shared<relaxcc::algorithms::GradientAllreduce>();
}

// Steps [from, to) of this rank's slices, one backward each.
void train(Net& net, DistributedDataParallel& ddp, torch::optim::Optimizer& sgd, int from, int to) {
  const auto comm = world();
  for (int s = from; s < to; ++s) {
    sgd.zero_grad();
    auto [x, y] = my_slice(s, comm->rank(), comm->size());
    loss_of(net, x, y).backward();
    ddp.step();
  }
}

constexpr int kSteps = 5;
// Float tolerance: the averaged gradient differs from the concatenated
// batch's by the rounding of the sum (a few ulps), and five momentum steps
// at lr 0.1 carry that into the weights.
constexpr float kTolerance = 2e-6f;

// Single-process training on the concatenated batches (`micro` micro-batches
// per step, accumulated).
std::vector<torch::Tensor> reference(Net& net, torch::optim::Optimizer& sgd, int ranks, int micro) {
  for (int s = 0; s < kSteps; ++s) {
    sgd.zero_grad();
    for (int m = 0; m < micro; ++m) {
      auto [x, y] = global_batch(s * micro + m, ranks);
      loss_of(net, x, y).backward();
    }
    sgd.step();
  }
  return snapshot(net);
}
std::vector<torch::Tensor> reference(int ranks, int micro) {
  Net net = make_net();
  auto sgd = make_sgd(net);
  return reference(net, sgd, ranks, micro);
}

// Copied gradients or bucket views, in several buckets (and a plan rebuild).
class Views : public testing::TestWithParam<bool> {
 protected:
  static DdpOptions options() {
    DdpOptions o;
    o.reducer.gradient_as_bucket_view = GetParam();
    o.reducer.plan.cap_bytes = 512;
    o.reducer.plan.first_cap_bytes = 256;
    return o;
  }
};

TEST_P(Views, GradientAllreduceEqualsTheConcatenatedBatch) {
  const auto comm = world();
  Net net = make_net();
  auto sgd = make_sgd(net);
  DistributedDataParallel ddp(comm, *net, sgd, allreduce(), options());
  train(net, ddp, sgd, 0, kSteps);
  EXPECT_EQ(ddp.steps(), kSteps);
  EXPECT_GT(ddp.reducer().plan().buckets().size(), 1u);
  EXPECT_LE(max_diff(snapshot(net), reference(comm->size(), 1)), kTolerance);
}

TEST_P(Views, NoSyncAccumulates) {
  const auto comm = world();
  Net net = make_net();
  auto sgd = make_sgd(net);
  DistributedDataParallel ddp(comm, *net, sgd, allreduce(), options());
  const auto before = comm->stats().bytes_sent;
  for (int s = 0; s < kSteps; ++s) {
    sgd.zero_grad();
    {
      auto guard = ddp.no_sync();
      auto [x, y] = my_slice(2 * s, comm->rank(), comm->size());
      loss_of(net, x, y).backward();
    }
    if (s == 0) {
      EXPECT_EQ(comm->stats().bytes_sent, before);  // nothing travelled
    }
    auto [x, y] = my_slice(2 * s + 1, comm->rank(), comm->size());
    loss_of(net, x, y).backward();
    ddp.step();
  }
  EXPECT_LE(max_diff(snapshot(net), reference(comm->size(), 2)), kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Ddp, Views, testing::Bool(),
                         [](const auto& p) { return p.param ? "bucket_views" : "copied"; });

TEST(Ddp, UnusedParameterDoesNotHangAndStaysUntouched) {
  const auto comm = world();
  Net net = make_net();
  auto sgd = make_sgd(net);
  DistributedDataParallel ddp(comm, *net, sgd, allreduce());
  const torch::Tensor spare = net->spare->weight.detach().clone();
  train(net, ddp, sgd, 0, kSteps);
  EXPECT_TRUE(torch::equal(net->spare->weight, spare));
  EXPECT_LE(max_diff(snapshot(net), reference(comm->size(), 1)), kTolerance);
}

// Where `spare` is used in step s of unused_later: every rank, rank 0 only,
// or no rank.
enum class SpareUse { everywhere, rank0, nowhere };
constexpr SpareUse kSpareUse[] = {SpareUse::everywhere, SpareUse::everywhere, SpareUse::rank0,
                                  SpareUse::nowhere,    SpareUse::nowhere,    SpareUse::everywhere};
constexpr int kSpareSteps = 6;

// Single-process training on the concatenated batches with `spare` used as
// kSpareUse says, gradients reset to undefined before each step (a
// parameter without a gradient is skipped by SGD, momentum included).
std::vector<torch::Tensor> reference_with_spare(int ranks) {
  Net net = make_net();
  auto sgd = make_sgd(net);
  for (int s = 0; s < kSpareSteps; ++s) {
    for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
    auto [x, y] = global_batch(s, ranks);
    torch::Tensor loss = loss_of(net, x, y);
    if (kSpareUse[s] == SpareUse::everywhere) loss = loss_with_spare(net, x, y, x);
    if (kSpareUse[s] == SpareUse::rank0)  // rank 0's mean over its slice, averaged over ranks
      loss = loss + 0.1 / ranks *
                        net->spare->forward(x.narrow(0, 0, kBatch).narrow(1, 0, 2)).pow(2).mean();
    loss.backward();
    sgd.step();
  }
  return snapshot(net);
}

TEST_P(Views, AParameterUnusedEverywhereInALaterStepKeepsItsValue) {
  const auto comm = world();
  Net net = make_net();
  auto sgd = make_sgd(net);
  DistributedDataParallel ddp(comm, *net, sgd, allreduce(), options());
  for (int s = 0; s < kSpareSteps; ++s) {
    sgd.zero_grad();
    auto [x, y] = my_slice(s, comm->rank(), comm->size());
    const bool use = kSpareUse[s] == SpareUse::everywhere ||
                     (kSpareUse[s] == SpareUse::rank0 && comm->rank() == 0);
    (use ? loss_with_spare(net, x, y, x) : loss_of(net, x, y)).backward();
    const torch::Tensor weight = net->spare->weight.detach().clone();
    const torch::Tensor bias = net->spare->bias.detach().clone();
    ddp.step();
    // Momentum from the steps that used it must not move it where no rank
    // used it; where some rank did, every rank moves it.
    const bool kept =
        torch::equal(net->spare->weight, weight) && torch::equal(net->spare->bias, bias);
    EXPECT_EQ(kept, kSpareUse[s] == SpareUse::nowhere) << "step " << s;
    EXPECT_TRUE(net->spare->weight.grad().defined()) << "step " << s;
  }
  EXPECT_LE(max_diff(snapshot(net), reference_with_spare(comm->size())), kTolerance);
}

TEST(Ddp, ATiedParameterIsRegisteredOnce) {
  const auto comm = world();
  Net net = make_net(false, kHidden, /*tied=*/true);
  // The optimizer holds each tensor once (libtorch's parameters() lists a
  // tied tensor under each of its names).
  std::vector<torch::Tensor> unique = net->parameters();
  unique.resize(unique.size() - 2);  // fc2_again's weight and bias are fc2's
  torch::optim::SGD sgd(unique, torch::optim::SGDOptions(0.1).momentum(0.9));
  DistributedDataParallel ddp(comm, *net, sgd, allreduce());
  size_t registered = 0;
  for (const auto& bucket : ddp.reducer().plan().buckets()) registered += bucket.entries.size();
  EXPECT_EQ(registered, unique.size());
  train(net, ddp, sgd, 0, kSteps);
  std::vector<torch::Tensor> mine = snapshot(net);
  mine.resize(unique.size());
  EXPECT_LE(max_diff(mine, reference(comm->size(), 1)), kTolerance);
  // Averaging visits the tied tensor once (twice would race two allreduces
  // on the same memory).
  const torch::Tensor before = net->fc2->weight.detach().clone();
  ddp.with_averaged_model([&] { EXPECT_TRUE(torch::allclose(net->fc2->weight, before, 0, 1e-6)); });
}

TEST(Ddp, ParametersAndBuffersAreBroadcastFromRankZero) {
  const auto comm = world();
  torch::manual_seed(comm->rank());  // every rank starts from other weights
  Net net(kHidden, true);
  auto sgd = make_sgd(net);
  DistributedDataParallel ddp(comm, *net, sgd, allreduce());
  auto gather = [&](const torch::Tensor& t) {
    torch::Tensor all = torch::empty({comm->size(), t.numel()});
    comm->allgather(relaxcc::TensorView::host(t.data_ptr<float>(), t.numel()),
                    relaxcc::TensorView::host(all.data_ptr<float>(), all.numel()),
                    relaxcc::ExecContext::host())
        ->wait();
    return all;
  };
  for (int s = 0; s < 2; ++s) {
    sgd.zero_grad();
    // Each rank's own data: the batch-norm statistics differ before the
    // broadcast.
    auto [x, y] = my_slice(s, comm->rank(), comm->size());
    loss_of(net, x * (1 + comm->rank()), y).backward();
    ddp.step();
    for (const torch::Tensor& t : {net->norm->running_mean, net->norm->running_var,
                                   net->fc1->weight.detach().contiguous()}) {
      const torch::Tensor all = gather(t);
      for (int r = 1; r < comm->size(); ++r) EXPECT_TRUE(torch::equal(all[r], all[0]));
    }
  }
}

// A run of 6 steps, straight or saved after 3 and resumed in a new model,
// optimizer, algorithm and DistributedDataParallel.
std::vector<torch::Tensor> run_local_sgd(bool resume, const std::string& prefix) {
  const auto comm = world();
  auto algorithm = [] {
    return std::make_shared<relaxcc::algorithms::LocalSgd>(
        relaxcc::algorithms::LocalSgdOptions{.period = 2, .warmup_steps = 1});
  };
  Net net = make_net();
  auto sgd = make_sgd(net);
  {
    DistributedDataParallel ddp(comm, *net, sgd, algorithm());
    train(net, ddp, sgd, 0, resume ? 3 : 6);
    if (!resume) return snapshot(net);
    ddp.save(prefix);
  }
  Net fresh = make_net();
  auto fresh_sgd = make_sgd(fresh);
  DistributedDataParallel ddp(comm, *fresh, fresh_sgd, algorithm());
  ddp.load(prefix);
  EXPECT_EQ(ddp.steps(), 3);
  train(fresh, ddp, fresh_sgd, 3, 6);
  return snapshot(fresh);
}

std::string checkpoint_prefix(const char* name) {
  // Rank 0's process id names the run; every rank writes its own file.
  int64_t id = ::getpid();
  world()->broadcast(relaxcc::TensorView::host(&id, 1), relaxcc::ExecContext::host())->wait();
  return "/tmp/relaxcc_torch_ddp_test_" + std::to_string(id) + "_" + name;
}

TEST(Ddp, CheckpointResumeReproducesTheRunBitForBit) {
  const std::string prefix = checkpoint_prefix("resume");
  const auto straight = run_local_sgd(false, prefix);
  const auto resumed = run_local_sgd(true, prefix);
  EXPECT_TRUE(bitwise_equal(straight, resumed));
  std::remove((prefix + ".rank" + std::to_string(world()->rank())).c_str());
}

// The parameter registered first, `head`, is used last in forward: its
// gradient is ready first, so the plan rebuilt after the first step packs
// it first, unlike the initial plan (reverse registration order).
struct LateHeadImpl : torch::nn::Module {
  LateHeadImpl() {
    head = register_module("head", torch::nn::Linear(kHidden, kOut));
    body = register_module("body", torch::nn::Linear(kIn, kHidden));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return head->forward(torch::tanh(body->forward(x)));
  }
  torch::nn::Linear head{nullptr}, body{nullptr};
};
TORCH_MODULE(LateHead);

// Each algorithm module in a configuration whose steps depend on the state a
// checkpoint keeps: error feedback, warmups that end before the save,
// periods that straddle it, no deadlines (a deadline makes rounds depend on
// timing). `bit_for_bit`: the module promises a bit-for-bit resume
// (async_model_average does not: its averages land by timing).
struct ResumeCase {
  std::string name;
  std::function<relaxcc::AlgorithmPtr()> make;
  bool bit_for_bit = true;
};

std::vector<ResumeCase> resume_cases() {
  namespace a = relaxcc::algorithms;
  std::vector<ResumeCase> out;
  out.push_back({"gradient_allreduce", [] { return std::make_shared<a::GradientAllreduce>(); }});
  out.push_back({"local_sgd", [] {
                   return std::make_shared<a::LocalSgd>(
                       a::LocalSgdOptions{.period = 2, .warmup_steps = 1});
                 }});
  out.push_back({"bytegrad", [] {
                   a::ByteGradOptions o;
                   o.hierarchical = false;  // quantized on one machine too
                   o.error_feedback = true;
                   return std::make_shared<a::ByteGrad>(o);
                 }});
  out.push_back({"qadam", [] {
                   a::QAdamOptions o;
                   o.warmup_steps = 2;
                   return std::make_shared<a::QAdam>(o);
                 }});
  out.push_back({"cocktail_sgd", [] {
                   a::CocktailSgdOptions o;
                   o.warmup_steps = 1;
                   return std::make_shared<a::CocktailSgd>(o);
                 }});
  out.push_back({"decentralized_sgd", [] {
                   a::DecentralizedSgdOptions o;
                   o.mode = relaxcc::GossipMode::shift_one;
                   return std::make_shared<a::DecentralizedSgd>(o);
                 }});
  out.push_back({"low_precision_decentralized_sgd",
                 [] { return std::make_shared<a::LowPrecisionDecentralizedSgd>(); }});
  out.push_back({"moshpit_sgd", [] {
                   a::MoshpitSgdOptions o;
                   o.deadline = {};
                   return std::make_shared<a::MoshpitSgd>(o);
                 }});
  out.push_back({"diloco", [] {
                   a::DilocoOptions o;
                   o.inner_steps = 2;
                   o.fragments = 2;
                   o.overlap_steps = 1;
                   o.codec = relaxcc::kernels::CompressorConfig{};  // 8-bit min-max
                   return std::make_shared<a::Diloco>(o);
                 }});
  out.push_back(
      {"async_model_average", [] { return std::make_shared<a::AsyncModelAverage>(); }, false});
  return out;
}

constexpr int kResumeSteps = 6, kSaveAfter = 3;

// Steps [from, to) of LateHead on this rank's slices.
void train_late(LateHead& net, DistributedDataParallel& ddp, torch::optim::SGD& sgd, int from,
                int to) {
  const auto comm = world();
  for (int s = from; s < to; ++s) {
    sgd.zero_grad();
    auto [x, y] = my_slice(s, comm->rank(), comm->size());
    torch::nn::functional::cross_entropy(net->forward(x), y).backward();
    ddp.step();
  }
}

LateHead make_late_head() {
  torch::manual_seed(42);
  return LateHead();
}

std::vector<torch::Tensor> snapshot_of(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  return out;
}

// Algorithm x (copied gradients, bucket views).
class Resume : public testing::TestWithParam<std::tuple<int, bool>> {
 protected:
  static DdpOptions options() {
    DdpOptions o;
    o.reducer.gradient_as_bucket_view = std::get<1>(GetParam());
    o.reducer.plan.cap_bytes = 512;  // several buckets
    o.reducer.plan.first_cap_bytes = 256;
    return o;
  }
  static const ResumeCase& which() {
    static const std::vector<ResumeCase> cases = resume_cases();
    return cases[static_cast<size_t>(std::get<0>(GetParam()))];
  }
};

// Saved kSaveAfter steps after the plan was rebuilt (the default
// rebuild_after_first_step), loaded into a fresh DistributedDataParallel
// (whose plan is the initial one), and run on: the parameters after
// kResumeSteps match the uninterrupted run's bit for bit.
TEST_P(Resume, ACheckpointAfterThePlanRebuildResumesBitForBit) {
  const auto comm = world();
  const ResumeCase& c = which();
  const std::string prefix = checkpoint_prefix(("rebuilt_" + c.name).c_str());
  std::vector<torch::Tensor> straight;
  {
    LateHead net = make_late_head();
    auto sgd = make_sgd_of(*net);
    DistributedDataParallel ddp(comm, *net, sgd, c.make(), options());
    const std::vector<int> initial = ddp.reducer().plan().order();
    train_late(net, ddp, sgd, 0, kResumeSteps);
    EXPECT_NE(ddp.reducer().plan().order(), initial) << "the plan was not rebuilt";
    straight = snapshot_of(*net);
  }
  {
    LateHead net = make_late_head();
    auto sgd = make_sgd_of(*net);
    DistributedDataParallel ddp(comm, *net, sgd, c.make(), options());
    train_late(net, ddp, sgd, 0, kSaveAfter);
    EXPECT_EQ(ddp.reducer().plan_version(), 1u);  // rebuilt after the first step
    ddp.save(prefix);
  }
  LateHead net = make_late_head();
  auto sgd = make_sgd_of(*net);
  DistributedDataParallel ddp(comm, *net, sgd, c.make(), options());
  const std::vector<int> initial = ddp.reducer().plan().order();
  ASSERT_NO_THROW(ddp.load(prefix));
  EXPECT_NE(ddp.reducer().plan().order(), initial) << "the checkpoint's plan was not adopted";
  EXPECT_EQ(ddp.steps(), kSaveAfter);
  train_late(net, ddp, sgd, kSaveAfter, kResumeSteps);
  if (c.bit_for_bit) {
    EXPECT_TRUE(bitwise_equal(straight, snapshot_of(*net)));
  }
  comm->barrier()->wait();
  std::remove((prefix + ".rank" + std::to_string(comm->rank())).c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Ddp, Resume,
    testing::Combine(testing::Range(0, static_cast<int>(resume_cases().size())), testing::Bool()),
    [](const auto& p) {
      return resume_cases()[static_cast<size_t>(std::get<0>(p.param))].name +
             (std::get<1>(p.param) ? "_bucket_views" : "_copied");
    });

TEST(Ddp, WrappingTheSameModuleTwiceThrows) {
  const auto comm = world();
  Net net = make_net();
  auto sgd = make_sgd(net);
  DistributedDataParallel ddp(comm, *net, sgd, allreduce());
  EXPECT_THROW(DistributedDataParallel(comm, *net, sgd, allreduce()), relaxcc::InvalidArgument);
}

TEST(Ddp, ACheckpointOfAnotherRankCountThrows) {
  const auto comm = world();
  if (comm->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string prefix = checkpoint_prefix("ranks");
  const std::string fewer = checkpoint_prefix("fewer_ranks");
  {
    Net net = make_net();
    auto sgd = make_sgd(net);
    DistributedDataParallel ddp(comm, *net, sgd, allreduce());
    ddp.save(prefix);
  }
  // Rank 0 alone, on a one-rank communicator, loads the file of the job of
  // comm->size() ranks, and writes a checkpoint of one rank.
  auto solo = comm->split(comm->rank() == 0 ? 0 : -1, 0);
  if (comm->rank() == 0) {
    Net net = make_net();
    auto sgd = make_sgd(net);
    DistributedDataParallel ddp(solo, *net, sgd, allreduce());
    try {
      ddp.load(prefix);
      ADD_FAILURE() << "load accepted a checkpoint of another rank count";
    } catch (const relaxcc::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("another rank count"), std::string::npos) << e.what();
    }
    ddp.save(fewer);
  }
  comm->barrier()->wait();
  // The job of comm->size() ranks loads the one-rank checkpoint: the ranks
  // without a file report the rank count too.
  {
    Net net = make_net();
    auto sgd = make_sgd(net);
    DistributedDataParallel ddp(comm, *net, sgd, allreduce());
    try {
      ddp.load(fewer);
      ADD_FAILURE() << "rank " << comm->rank() << ": load accepted a checkpoint of fewer ranks";
    } catch (const relaxcc::InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("another rank count"), std::string::npos) << what;
      EXPECT_NE(what.find("rank 0's file"), std::string::npos) << what;
      EXPECT_NE(what.find("says 1"), std::string::npos) << what;
    }
  }
  comm->barrier()->wait();
  std::remove((prefix + ".rank" + std::to_string(comm->rank())).c_str());
  if (comm->rank() == 0) std::remove((fewer + ".rank0").c_str());
}

// The last rank's optimizer refuses the checkpoint's state (Adam against
// SGD's): every rank throws and keeps its own parameters.
TEST(Ddp, ACheckpointOneRankCannotRestoreChangesNoRank) {
  const auto comm = world();
  const std::string prefix = checkpoint_prefix("refused");
  {
    Net net = make_net();
    auto sgd = make_sgd(net);
    DistributedDataParallel ddp(comm, *net, sgd, allreduce());
    train(net, ddp, sgd, 0, 1);
    ddp.save(prefix);
  }
  Net net = make_net();
  auto sgd = make_sgd(net);
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
  const bool last = comm->rank() == comm->size() - 1;
  DistributedDataParallel ddp(comm, *net, last ? static_cast<torch::optim::Optimizer&>(adam) : sgd,
                              allreduce());
  const auto before = snapshot(net);
  EXPECT_THROW(ddp.load(prefix), relaxcc::InvalidArgument);
  EXPECT_TRUE(bitwise_equal(before, snapshot(net)));
  comm->barrier()->wait();
  std::remove((prefix + ".rank" + std::to_string(comm->rank())).c_str());
}

// A model with a frozen float64 parameter and an integer buffer next to a
// trainable layer.
struct MixedImpl : torch::nn::Module {
  MixedImpl() {
    fc = register_module("fc", torch::nn::Linear(kIn, kOut));
    scale = register_parameter("scale", torch::ones({3}, torch::kFloat64), /*requires_grad=*/false);
    count = register_buffer("count", torch::zeros({2}, torch::kInt64));
  }
  torch::nn::Linear fc{nullptr};
  torch::Tensor scale, count;
};
TORCH_MODULE(Mixed);

TEST(Ddp, AveragedModelAveragesAFrozenFloat64ParameterAndKeepsIntegers) {
  const auto comm = world();
  torch::manual_seed(42);
  Mixed net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  DistributedDataParallel ddp(comm, *net, sgd, allreduce());
  const int n = comm->size(), rank = comm->rank();
  {
    torch::NoGradGuard no_grad;
    net->scale.fill_(1.0 + rank);  // exact in float64: average (n + 1) / 2
    net->count.fill_(rank);
  }
  bool ran = false;
  ddp.with_averaged_model([&] {
    ran = true;
    EXPECT_TRUE(torch::equal(net->scale, torch::full({3}, (n + 1) / 2.0, torch::kFloat64)))
        << net->scale;
    EXPECT_TRUE(torch::equal(net->count, torch::full({2}, rank, torch::kInt64)));
  });
  EXPECT_TRUE(ran);
  EXPECT_TRUE(torch::equal(net->scale, torch::full({3}, 1.0 + rank, torch::kFloat64)));
}

TEST(Ddp, ModelsThatDifferAcrossRanksThrow) {
  const auto comm = world();
  if (comm->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Net net = make_net(false, comm->rank() == 1 ? kHidden + 1 : kHidden);
  auto sgd = make_sgd(net);
  EXPECT_THROW(DistributedDataParallel(comm, *net, sgd, allreduce()), relaxcc::PeerMismatch);
}

// Setup errors on one rank alone reach every rank at once: far below the
// 300 s of RELAXCC_TIMEOUT_MS's default, which the tests run with.
constexpr auto kAtOnce = std::chrono::seconds(5);

// The message of what `fn` throws as E, and how long it took ("" when it
// throws nothing).
template <typename E, typename F>
std::pair<std::string, std::chrono::steady_clock::duration> error_of(F&& fn) {
  const auto start = std::chrono::steady_clock::now();
  std::string what;
  try {
    fn();
  } catch (const E& e) {
    what = e.what();
  }
  return {what, std::chrono::steady_clock::now() - start};
}

// Rank 1 alone has a float64 model: every rank throws Unsupported at once,
// naming rank 1 and its parameter, and the communicator stays usable.
TEST(Ddp, AnUnsupportedParameterOnOneRankFailsEveryRankAtOnce) {
  const auto comm = world();
  if (comm->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Net net = make_net();
  if (comm->rank() == 1) net->to(torch::kFloat64);
  auto sgd = make_sgd(net);
  const auto [what, took] = error_of<relaxcc::Unsupported>(
      [&] { DistributedDataParallel ddp(comm, *net, sgd, allreduce()); });
  EXPECT_NE(what.find("parameter 'fc1.weight' is Double; only float32 parameters are supported"),
            std::string::npos)
      << what;
  if (comm->rank() != 1) {
    EXPECT_NE(what.find("DistributedDataParallel construction: rank 1 failed"), std::string::npos)
        << what;
  }
  EXPECT_LT(took, kAtOnce);
  EXPECT_FALSE(comm->poisoned());
  comm->barrier()->wait(std::chrono::seconds(30));
}

// gradient_allreduce whose init refuses its context on rank 1 alone;
// with `communicate`, the init of every other rank first runs an allreduce
// on the context's communicator, which rank 1 never joins.
class RefusingOnRankOne final : public relaxcc::Algorithm {
 public:
  explicit RefusingOnRankOne(bool communicate) : communicate_(communicate) {}
  std::string name() const override { return "refusing_on_rank_one"; }
  relaxcc::AlgorithmCapabilities capabilities() const override { return {}; }
  void init(const relaxcc::AlgorithmContext& ctx) override {
    RELAXCC_ENFORCE(ctx.comm->rank() != 1, InvalidArgument,
                    "refusing_on_rank_one: rank 1 refuses its context");
    if (communicate_) {
      auto one = std::make_shared<float>(1.0f);
      ctx.comm->allreduce(relaxcc::TensorView::host(one.get(), 1, one), ctx.exec)
          ->wait(std::chrono::seconds(120));
    }
    inner_.init(ctx);
  }
  relaxcc::WorkPtr on_bucket_ready(const relaxcc::StepInfo& s, int bucket,
                                   const relaxcc::TensorView& data) override {
    return inner_.on_bucket_ready(s, bucket, data);
  }

 private:
  bool communicate_;
  relaxcc::algorithms::GradientAllreduce inner_;
};

// Rank 1's algorithm refuses before any communication: the Reducer's
// agreement on the algorithm's init fails every rank at once, the others
// naming rank 1 and its error, and the communicator stays usable.
TEST(Ddp, AnAlgorithmThatRefusesOnOneRankFailsEveryRankAtOnce) {
  const auto comm = world();
  if (comm->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Net net = make_net();
  auto sgd = make_sgd(net);
  const auto [what, took] = error_of<relaxcc::InvalidArgument>([&] {
    DistributedDataParallel ddp(comm, *net, sgd, std::make_shared<RefusingOnRankOne>(false));
  });
  EXPECT_NE(what.find("rank 1 refuses its context"), std::string::npos) << what;
  if (comm->rank() != 1) {
    EXPECT_NE(what.find("Reducer construction: rank 1 failed"), std::string::npos) << what;
  }
  EXPECT_LT(took, kAtOnce);
  EXPECT_FALSE(comm->poisoned());
  comm->barrier()->wait(std::chrono::seconds(30));
}

// Rank 1 throws while the others wait in a collective of the algorithm's
// init that it never joins: past the agreement's grace (0.5 s), rank 1
// poisons the communicator, and the others throw CommunicatorPoisoned
// naming rank 1 and its error, long before their 120 s timeout.
TEST(Ddp, AnAlgorithmThatFailsWhileTheOthersWaitPoisonsTheCommunicator) {
  if (world()->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  // A communicator of its own: this one ends poisoned.
  const auto comm = world()->split(0, world()->rank());
  Net net = make_net();
  auto sgd = make_sgd(net);
  DdpOptions options;
  options.reducer.timeout = std::chrono::seconds(120);
  const auto [what, took] = error_of<relaxcc::Error>([&] {
    DistributedDataParallel ddp(comm, *net, sgd, std::make_shared<RefusingOnRankOne>(true),
                                options);
  });
  EXPECT_NE(what.find("rank 1 refuses its context"), std::string::npos) << what;
  if (comm->rank() != 1) {
    EXPECT_NE(what.find("CommunicatorPoisoned"), std::string::npos) << what;
    EXPECT_NE(what.find("by rank 1"), std::string::npos) << what;
  }
  EXPECT_LT(took, kAtOnce);
  EXPECT_TRUE(comm->poisoned());
  world()->barrier()->wait(std::chrono::seconds(30));
}

// Rank 1 has no file of the checkpoint: every rank throws InvalidArgument
// at once, the others naming rank 1.
TEST(Ddp, ACheckpointOneRankCannotReadFailsEveryRankAtOnce) {
  const auto comm = world();
  if (comm->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string prefix = checkpoint_prefix("missing_on_rank1");
  const std::string mine = prefix + ".rank" + std::to_string(comm->rank());
  Net net = make_net();
  auto sgd = make_sgd(net);
  DistributedDataParallel ddp(comm, *net, sgd, allreduce());
  ddp.save(prefix);
  if (comm->rank() == 1) std::remove(mine.c_str());
  const auto [what, took] = error_of<relaxcc::InvalidArgument>([&] { ddp.load(prefix); });
  EXPECT_NE(what.find(comm->rank() == 1 ? "rank 1: cannot read checkpoint"
                                        : "ranks [1] cannot load their files"),
            std::string::npos)
      << what;
  EXPECT_LT(took, kAtOnce);
  EXPECT_FALSE(comm->poisoned());
  comm->barrier()->wait(std::chrono::seconds(30));
  std::remove(mine.c_str());
}

TEST(Ddp, UnevenInputsNameTheRanks) {
  const auto comm = world();
  if (comm->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Net net = make_net();
  auto sgd = make_sgd(net);
  DistributedDataParallel ddp(comm, *net, sgd, allreduce());
  // Rank 0 has one batch more than the others.
  const int batches = comm->rank() == 0 ? 3 : 2;
  std::string message;
  try {
    train(net, ddp, sgd, 0, batches);
    ddp.finish();
  } catch (const std::exception& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("uneven inputs"), std::string::npos) << message;
  EXPECT_NE(message.find("went on"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 0: 2"), std::string::npos) << message;
}

// Both constructors take a null algorithm for gradient_allreduce.
TEST(Ddp, ANullAlgorithmIsGradientAllreduceInBothConstructors) {
  const auto comm = world();
  {
    Net net = make_net();
    auto sgd = make_sgd(net);
    DistributedDataParallel ddp(comm, *net, sgd, nullptr);
    EXPECT_EQ(ddp.algorithm().name(), "gradient_allreduce");
    train(net, ddp, sgd, 0, kSteps);
    EXPECT_LE(max_diff(snapshot(net), reference(comm->size(), 1)), kTolerance);
  }
  Net net = make_net();
  auto sgd = make_sgd(net);
  DistributedDataParallel ddp(*net, sgd, nullptr);
  EXPECT_EQ(ddp.algorithm().name(), "gradient_allreduce");
}

// qadam owns the step; its learning rate is the torch optimizer's, read at
// construction and before every step. In warmup it is Adam on the averaged
// gradient, so it follows torch's Adam on the concatenated batch at the
// torch optimizer's lr (not QAdamOptions' default 1e-3), from the first step
// on (the Reducer's plan rebuild after it loses no bucket of that step).
TEST(Ddp, QAdamTakesTheTorchOptimizersLearningRate) {
  const auto comm = world();
  constexpr double kLr = 0.01;
  Net net = make_net();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(kLr));
  auto qadam = std::make_shared<relaxcc::algorithms::QAdam>();  // lr 1e-3, warmup 100 steps
  DistributedDataParallel ddp(comm, *net, adam, qadam);
  EXPECT_EQ(qadam->lr(), static_cast<float>(kLr));
  train(net, ddp, adam, 0, kSteps);
  Net ref = make_net();
  torch::optim::Adam ref_adam(ref->parameters(), torch::optim::AdamOptions(kLr));
  // Five Adam steps move each weight by up to 5 lr = 0.05; the two Adams
  // differ in the order of their float operations only.
  EXPECT_LE(max_diff(snapshot(net), reference(ref, ref_adam, comm->size(), 1)), 1e-5f);
  // A scheduler's change applies at the next step.
  for (auto& group : adam.param_groups()) group.options().set_lr(0.002);
  train(net, ddp, adam, kSteps, kSteps + 1);
  EXPECT_EQ(qadam->lr(), 0.002f);
}

TEST(Ddp, QAdamRefusesParameterGroupsWithDifferentLearningRates) {
  const auto comm = world();
  Net net = make_net();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(net->fc1->parameters(), std::make_unique<torch::optim::AdamOptions>(0.01));
  std::vector<torch::Tensor> rest = net->fc2->parameters();
  for (const auto& p : net->spare->parameters()) rest.push_back(p);
  groups.emplace_back(rest, std::make_unique<torch::optim::AdamOptions>(0.02));
  torch::optim::Adam adam(groups, torch::optim::AdamOptions(0.01));
  try {
    DistributedDataParallel ddp(comm, *net, adam, std::make_shared<relaxcc::algorithms::QAdam>());
    ADD_FAILURE() << "accepted two learning rates";
  } catch (const relaxcc::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("parameter group 1 has lr 0.02"), std::string::npos)
        << e.what();
  }
}

// relaxcc/torch/ddp.h is the one include a training loop needs, the build
// description included.
TEST(Ddp, TheOneIncludeDescribesTheBuild) {
  EXPECT_NE(relaxcc::build_description().find(RELAXCC_VERSION_STRING), std::string::npos)
      << relaxcc::build_description();
}

}  // namespace
