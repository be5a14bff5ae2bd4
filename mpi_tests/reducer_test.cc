// Buckets, the overlap scheduler, the Algorithm interface, gradient_allreduce,
// local_sgd, optimizers and state dicts.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include <unistd.h>

#include <cstdio>

#include <gtest/gtest.h>

#include "kernels/cuda/cuda_kernels.h"
#include "relaxcc/algorithms/bytegrad.h"
#include "relaxcc/algorithms/gradient_allreduce.h"
#include "relaxcc/algorithms/local_sgd.h"
#include "relaxcc/errors.h"
#include "relaxcc/kernels/cuda_runtime.h"
#include "relaxcc/logging.h"
#include "relaxcc/nccl_communicator.h"
#include "relaxcc/reducer.h"
#include "relaxcc/relaxed/compressed_allreduce.h"
#include "relaxcc/topology.h"
#include "relaxcc/traffic_counter.h"
#include "test_util.h"

namespace relaxcc {
namespace {

using algorithms::GradientAllreduce;
using algorithms::GradientAllreduceOptions;
using algorithms::LocalSgd;
using algorithms::LocalSgdOptions;
using namespace std::chrono_literals;

// A model of `sizes` parameters: gradient i at index 2i, its parameter at 2i+1.
struct Model {
  std::vector<std::vector<float>> grads, params;
  std::vector<TensorSpec> specs;
  explicit Model(const std::vector<int64_t>& sizes) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      grads.emplace_back(sizes[i]);
      params.emplace_back(sizes[i]);
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      specs.push_back({"g" + std::to_string(i), TensorView::host(grads[i].data(), sizes[i]),
                       TensorRole::gradient, static_cast<int>(2 * i + 1)});
      specs.push_back({"p" + std::to_string(i), TensorView::host(params[i].data(), sizes[i]),
                       TensorRole::parameter});
    }
  }
  // gradient i, element j on rank r: a small integer that encodes all three
  void fill(int rank, int step = 0) {
    for (size_t i = 0; i < grads.size(); ++i)
      for (size_t j = 0; j < grads[i].size(); ++j)
        grads[i][j] = static_cast<float>(test::encode(rank, j + 7 * i + step));
  }
  float expected_sum(int ranks, size_t i, size_t j, int step = 0, int skip_rank = -1) const {
    float s = 0;
    for (int r = 0; r < ranks; ++r)
      if (r != skip_rank) s += static_cast<float>(test::encode(r, j + 7 * i + step));
    return s;
  }
  static int grad_index(int i) { return 2 * i; }
};

// Buckets of exactly `cap` bytes, kept as built (no rebuild after step 1).
ReducerOptions fixed_buckets(int64_t cap) {
  ReducerOptions o;
  o.plan.first_cap_bytes = cap;
  o.plan.cap_bytes = cap;
  o.rebuild_after_first_step = false;
  return o;
}

// Records the Work of every bucket.
class RecordingAllreduce final : public Algorithm {
 public:
  std::string name() const override { return "recording"; }
  AlgorithmCapabilities capabilities() const override { return {}; }
  void init(const AlgorithmContext& ctx) override {
    inner_.init(ctx);
    ++inits;
  }
  WorkPtr on_bucket_ready(const StepInfo& s, int bucket, const TensorView& data) override {
    auto w = inner_.on_bucket_ready(s, bucket, data);
    std::lock_guard<std::mutex> lock(mutex);
    works.push_back(w);
    return w;
  }
  std::mutex mutex;
  std::vector<WorkPtr> works;
  int inits = 0;

 private:
  GradientAllreduce inner_{GradientAllreduceOptions{false, false}};
};

TEST(BucketPlan, SizesAlignmentOrderAndDtypes) {
  std::vector<float> a(100), b(300), c(0), d(50);
  std::vector<double> e(40);
  std::vector<TensorSpec> t{{"a", TensorView::host(a.data(), 100)},
                            {"b", TensorView::host(b.data(), 300)},
                            {"c", TensorView::host(c.data(), 0)},
                            {"d", TensorView::host(d.data(), 50)},
                            {"e", TensorView::host(e.data(), 40)}};
  BucketPlanOptions o;
  o.first_cap_bytes = 256;
  o.cap_bytes = 1600;
  o.alignment_bytes = 64;
  const BucketPlan plan = BucketPlan::build(t, {}, o);
  // Reverse order: e (f64) opens its own bucket; d fits the small first f32 bucket? 50*4=200 <=
  // 256.
  ASSERT_EQ(plan.order(), (std::vector<int>{4, 3, 2, 1, 0}));
  const auto& bs = plan.buckets();
  ASSERT_EQ(bs.size(), 3u);
  EXPECT_EQ(bs[0].dtype, DType::f64);  // e: first bucket
  EXPECT_EQ(bs[0].numel, 40);
  EXPECT_EQ(bs[1].dtype, DType::f32);  // d, c (empty), b
  ASSERT_EQ(bs[1].entries.size(), 3u);
  EXPECT_EQ(bs[1].entries[0].tensor, 3);
  EXPECT_EQ(bs[1].entries[0].offset, 0);
  EXPECT_EQ(bs[1].entries[1].tensor, 2);
  EXPECT_EQ(bs[1].entries[1].offset, 64);  // aligned to 64 bytes = 16 floats
  EXPECT_EQ(bs[1].entries[2].tensor, 1);
  EXPECT_EQ(bs[1].entries[2].offset, 64);
  EXPECT_EQ(bs[1].numel, 364);
  EXPECT_EQ(bs[2].entries.size(), 1u);  // a: would exceed the cap
  EXPECT_EQ(bs[2].entries[0].tensor, 0);
  for (const auto& bucket : bs)
    for (const auto& en : bucket.entries) EXPECT_EQ(en.offset % (64 / dtype_size(bucket.dtype)), 0);
  EXPECT_EQ(plan.locate(3), (std::pair<int, int>{1, 0}));
  EXPECT_NE(plan.hash(t), BucketPlan::build(t, {0, 1, 2, 3, 4}, o).hash(t));
  EXPECT_THROW(BucketPlan::build(t, {0, 0, 1, 2, 3}, o), InvalidArgument);
}

TEST(Reducer, GradientAllreduceEqualsMpiAllreduce) {
  auto comm = test::world();
  const int n = comm->size(), r = comm->rank();
  for (bool view : {false, true}) {
    Model m({1000, 33, 70000, 1, 4096});
    ReducerOptions o;
    o.plan.first_cap_bytes = 4096;
    o.plan.cap_bytes = 100000;
    o.gradient_as_bucket_view = view;
    Reducer reducer(comm, m.specs,
                    std::make_shared<GradientAllreduce>(GradientAllreduceOptions{false, false}),
                    ExecContext::host(), o);
    for (int step = 0; step < 3; ++step) {
      m.fill(r, step);
      reducer.begin_step();
      for (int i = 4; i >= 0; --i) {
        if (view) {
          const TensorView g = reducer.gradient_view(Model::grad_index(i));
          std::memcpy(g.data, m.grads[i].data(), g.nbytes());
        }
        reducer.mark_ready(Model::grad_index(i));
      }
      reducer.synchronize();
      // MPI_Allreduce of the same data is the reference.
      for (size_t i = 0; i < m.grads.size(); ++i) {
        std::vector<float> want(m.grads[i].size());
        for (size_t j = 0; j < want.size(); ++j)
          want[j] = static_cast<float>(test::encode(r, j + 7 * i + step));
        MPI_Allreduce(MPI_IN_PLACE, want.data(), static_cast<int>(want.size()), MPI_FLOAT, MPI_SUM,
                      MPI_COMM_WORLD);
        const TensorView got = reducer.gradient_view(Model::grad_index(static_cast<int>(i)));
        ASSERT_EQ(std::memcmp(got.data, want.data(), got.nbytes()), 0)
            << "view " << view << " tensor " << i;
      }
    }
    EXPECT_EQ(n, comm->size());
  }
}

// The compressed allreduce as a bucket operation: each bucket goes through
// compressed_allreduce (f16, with error feedback per bucket), several
// buckets in flight at once; small integers sum exactly in f16.
class CompressedBuckets final : public Algorithm {
 public:
  std::string name() const override { return "compressed buckets"; }
  AlgorithmCapabilities capabilities() const override {
    AlgorithmCapabilities c;
    c.depends_on_bucket_boundaries = true;
    return c;
  }
  void init(const AlgorithmContext& ctx) override {
    comm_ = ctx.comm;
    states_.clear();
    for (const Bucket& b : ctx.plan->buckets())
      states_.push_back(
          std::make_unique<CompressedAllreduceState>(b.numel, comm_->rank(), comm_->size()));
  }
  WorkPtr on_bucket_ready(const StepInfo&, int bucket, const TensorView& data) override {
    CompressedAllreduceOptions o;
    o.codec = kernels::CompressorConfig{};
    o.codec->kind = kernels::CompressorKind::f16;
    o.state = states_[static_cast<size_t>(bucket)].get();
    o.label = "bucket " + std::to_string(bucket);
    return compressed_allreduce(*comm_, data, ExecContext::host(), o);
  }

 private:
  CommunicatorPtr comm_;
  std::vector<std::unique_ptr<CompressedAllreduceState>> states_;
};

TEST(Reducer, CompressedAllreduceAsTheBucketOperation) {
  auto comm = test::world();
  const int n = comm->size(), r = comm->rank();
  Model m({1000, 33, 70000, 1, 4096});
  Reducer reducer(comm, m.specs, std::make_shared<CompressedBuckets>(), ExecContext::host(),
                  fixed_buckets(16384));
  for (int step = 0; step < 3; ++step) {
    m.fill(r, step);
    reducer.begin_step();
    for (int i = 4; i >= 0; --i) reducer.mark_ready(Model::grad_index(i));
    reducer.synchronize();
    for (size_t i = 0; i < m.grads.size(); ++i)
      for (size_t j = 0; j < m.grads[i].size(); ++j)
        ASSERT_EQ(m.grads[i][j], m.expected_sum(n, i, j, step))
            << "step " << step << " tensor " << i << " element " << j;
  }
}

TEST(Reducer, ReadinessOutOfOrderAndFromSeveralThreads) {
  auto comm = test::world();
  const int n = comm->size(), r = comm->rank();
  std::vector<int64_t> sizes(24, 513);
  Model m(sizes);
  ReducerOptions o;
  o.plan.first_cap_bytes = 4096;
  o.plan.cap_bytes = 8192;
  Reducer reducer(comm, m.specs,
                  std::make_shared<GradientAllreduce>(GradientAllreduceOptions{false, false}),
                  ExecContext::host(), o);
  m.fill(r);
  reducer.begin_step();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = t; i < 24; i += 4) reducer.mark_ready(Model::grad_index((i * 7 + r) % 24));
    });
  for (auto& th : threads) th.join();
  reducer.synchronize();
  for (size_t i = 0; i < sizes.size(); ++i)
    for (size_t j = 0; j < m.grads[i].size(); ++j)
      ASSERT_EQ(m.grads[i][j], m.expected_sum(n, i, j));
}

TEST(Reducer, CommunicationOverlapsTheRestOfBackward) {
  auto comm = test::world();
  if (comm->size() == 1) GTEST_SKIP() << "a single rank has nothing to overlap";
  Model m({200000, 200000});
  auto algo = std::make_shared<RecordingAllreduce>();
  Reducer reducer(comm, m.specs, algo, ExecContext::host(), fixed_buckets(800000));
  ASSERT_EQ(reducer.plan().buckets().size(), 2u);
  m.fill(comm->rank());
  reducer.begin_step();
  reducer.mark_ready(Model::grad_index(1));  // fills bucket 0 (reverse order)
  // Bucket 0 goes on the wire (dispatched by the copy thread once its
  // gradient is in) and completes while bucket 1 is still being produced.
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  WorkPtr first;
  while (!first && std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(algo->mutex);
      ASSERT_LE(algo->works.size(), 1u);
      if (!algo->works.empty()) first = algo->works[0];
    }
    if (!first) std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(first) << "bucket 0 was not dispatched";
  while (!first->is_completed() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(first->is_completed());
  reducer.mark_ready(Model::grad_index(0));
  reducer.synchronize();
  EXPECT_EQ(reducer.dispatch_times().size(), 2u);
  EXPECT_EQ(m.grads[1][5], m.expected_sum(comm->size(), 1, 5));
}

TEST(Reducer, UnusedTensorsAreSettledByAgreement) {
  auto comm = test::world();
  const int n = comm->size(), r = comm->rank();
  Model m({100, 100, 100});
  ReducerOptions o;
  o.plan.first_cap_bytes = 1 << 20;
  Reducer reducer(comm, m.specs,
                  std::make_shared<GradientAllreduce>(GradientAllreduceOptions{false, false}),
                  ExecContext::host(), o);
  m.fill(r);
  std::fill(m.grads[2].begin(), m.grads[2].end(), 42.0f);
  reducer.begin_step();
  reducer.mark_ready(Model::grad_index(0));
  if (r != 0) reducer.mark_ready(Model::grad_index(1));  // unused on rank 0 only
  // tensor 2: unused on every rank
  reducer.synchronize();
  for (size_t j = 0; j < 100; ++j) {
    ASSERT_EQ(m.grads[0][j], m.expected_sum(n, 0, j));
    // Rank 0 contributed zeros and receives the others' sum; with one rank
    // the tensor is unused everywhere and keeps its value.
    const float want1 =
        n > 1 ? m.expected_sum(n, 1, j, 0, 0) : static_cast<float>(test::encode(0, j + 7));
    ASSERT_EQ(m.grads[1][j], want1);
    ASSERT_EQ(m.grads[2][j], 42.0f);  // untouched
  }
}

TEST(Reducer, NoSyncSkipsCommunication) {
  auto comm = test::world();
  const int n = comm->size(), r = comm->rank();
  Model m({1000});
  Reducer reducer(comm, m.specs,
                  std::make_shared<GradientAllreduce>(GradientAllreduceOptions{false, false}),
                  ExecContext::host());
  const uint64_t ops_before = comm->stats().operations;
  reducer.set_no_sync(true);
  for (int k = 0; k < 3; ++k) {
    reducer.begin_step();
    reducer.mark_ready(0);
    reducer.synchronize();
  }
  EXPECT_EQ(comm->stats().operations, ops_before);  // nothing moved
  reducer.set_no_sync(false);
  m.fill(r);
  reducer.begin_step();
  reducer.mark_ready(0);
  reducer.synchronize();
  if (n > 1) {
    EXPECT_GT(comm->stats().operations, ops_before);  // a single rank moves nothing
  }
  for (size_t j = 0; j < 1000; ++j) ASSERT_EQ(m.grads[0][j], m.expected_sum(n, 0, j));
}

// A gradient accumulated in no_sync iterations counts as used in the
// synchronizing iteration even when that iteration does not mark it: its
// accumulation is reduced, not replaced by zeros (DDP's locally-used map).
TEST(Reducer, NoSyncAccumulationOfATensorUnmarkedAtSyncIsReduced) {
  auto comm = test::world();
  const int n = comm->size(), r = comm->rank();
  for (bool view : {false, true}) {
    Model m({100, 100, 100});
    ReducerOptions o = fixed_buckets(400);
    o.gradient_as_bucket_view = view;
    Reducer reducer(comm, m.specs,
                    std::make_shared<GradientAllreduce>(GradientAllreduceOptions{false, false}),
                    ExecContext::host(), o);
    const auto grad = [&](int i) {
      return view ? reducer.gradient_view(Model::grad_index(i)).as<float>() : m.grads[i].data();
    };
    // No_sync iteration: tensors 0 and 1 get gradients (step 0's data).
    m.fill(r);
    for (int i = 0; i < 3; ++i) std::memcpy(grad(i), m.grads[i].data(), 100 * sizeof(float));
    std::fill(grad(2), grad(2) + 100, 42.0f);
    reducer.set_no_sync(true);
    reducer.begin_step();
    reducer.mark_ready(Model::grad_index(0));
    reducer.mark_ready(Model::grad_index(1));
    reducer.synchronize();
    // Synchronizing iteration: only tensor 0 gets more (step 1's data).
    reducer.set_no_sync(false);
    reducer.begin_step();
    for (size_t j = 0; j < 100; ++j) grad(0)[j] += static_cast<float>(test::encode(r, j + 1));
    reducer.mark_ready(Model::grad_index(0));
    reducer.synchronize();
    for (size_t j = 0; j < 100; ++j) {
      ASSERT_EQ(grad(0)[j], m.expected_sum(n, 0, j) + m.expected_sum(n, 0, j, 1)) << view;
      ASSERT_EQ(grad(1)[j], m.expected_sum(n, 1, j)) << "view " << view << " element " << j;
      ASSERT_EQ(grad(2)[j], 42.0f) << view;  // unused everywhere: untouched
    }
    // The accumulation is consumed: the next iteration without tensor 1
    // leaves it unused everywhere.
    std::fill(grad(1), grad(1) + 100, 7.0f);
    reducer.begin_step();
    reducer.mark_ready(Model::grad_index(0));
    reducer.synchronize();
    ASSERT_EQ(grad(1)[0], 7.0f) << view;
  }
}

TEST(Reducer, PlanRebuildKeepsStateAndResults) {
  auto comm = test::world();
  const int n = comm->size(), r = comm->rank();
  Model m({300, 300, 300, 300});
  ReducerOptions o;
  o.plan.first_cap_bytes = 1200;
  o.plan.cap_bytes = 2400;
  o.gradient_as_bucket_view = true;
  auto algo = std::make_shared<LocalSgd>(LocalSgdOptions{1, 100});  // warmup: gradients allreduced
  Reducer reducer(comm, m.specs, algo, ExecContext::host(), o);
  int changes = 0;
  reducer.on_plan_changed([&] { ++changes; });
  const uint64_t before = reducer.plan().hash(m.specs);
  for (int step = 0; step < 2; ++step) {
    m.fill(r, step);
    reducer.begin_step();
    for (int i : {0, 2, 1, 3}) {  // not the registration order
      const TensorView g = reducer.gradient_view(Model::grad_index(i));
      std::memcpy(g.data, m.grads[i].data(), g.nbytes());
      reducer.mark_ready(Model::grad_index(i));
    }
    reducer.synchronize();
    for (int i = 0; i < 4; ++i) {
      const TensorView g = reducer.gradient_view(Model::grad_index(i));
      for (int64_t j = 0; j < g.numel; ++j)
        ASSERT_EQ(g.as<float>()[j], m.expected_sum(n, i, j, step) / static_cast<float>(n))
            << "step " << step;
    }
  }
  EXPECT_EQ(changes, 1);
  EXPECT_EQ(reducer.plan_version(), 1u);
  EXPECT_NE(reducer.plan().hash(m.specs), before);
  EXPECT_EQ(reducer.plan().order(), (std::vector<int>{0, 4, 2, 6, 7, 5, 3, 1}));
}

// One iteration of `m` on `reducer`, gradients marked in `order`.
void run_iteration(Reducer& reducer, Model& m, const std::vector<int>& order) {
  m.fill(test::world()->rank());
  reducer.begin_step();
  for (int i : order) reducer.mark_ready(Model::grad_index(i));
  reducer.synchronize();
}

// The message of the InvalidArgument that load_state_dict throws ("" when
// it does not throw).
std::string load_error(Reducer& reducer, const StateDict& state) {
  try {
    reducer.load_state_dict(state);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(Reducer, StateDictCarriesTheRebuiltPlan) {
  auto comm = test::world();
  const int n = comm->size(), r = comm->rank();
  Model m({300, 300, 300, 300});
  ReducerOptions o;
  o.plan.first_cap_bytes = 1200;
  o.plan.cap_bytes = 2400;
  Reducer saved(comm, m.specs, std::make_shared<GradientAllreduce>(), ExecContext::host(), o);
  const StateDict initial = saved.state_dict();
  run_iteration(saved, m, {0, 2, 1, 3});  // rebuilt from this order
  ASSERT_EQ(saved.plan_version(), 1u);
  const StateDict rebuilt = StateDict::deserialize(saved.state_dict().serialize());

  auto algo = std::make_shared<RecordingAllreduce>();
  Reducer fresh(comm, m.specs, algo, ExecContext::host(), o);
  int changes = 0;
  fresh.on_plan_changed([&] { ++changes; });
  const uint64_t initial_hash = fresh.plan().hash(m.specs);
  const int inits = algo->inits;
  fresh.load_state_dict(rebuilt);
  EXPECT_EQ(fresh.plan().order(), saved.plan().order());
  EXPECT_EQ(fresh.plan().hash(m.specs), saved.plan().hash(m.specs));
  EXPECT_EQ(fresh.plan_version(), 1u);
  EXPECT_EQ(changes, 1);
  EXPECT_EQ(algo->inits, inits + 1);
  // The same plan again changes nothing.
  fresh.load_state_dict(rebuilt);
  EXPECT_EQ(fresh.plan_version(), 1u);
  EXPECT_EQ(changes, 1);
  // The rebuild counts as done: another ready order leaves the plan alone,
  // and the sums are exact.
  run_iteration(fresh, m, {3, 2, 1, 0});
  EXPECT_EQ(fresh.plan_version(), 1u);
  for (size_t i = 0; i < 4; ++i)
    for (size_t j = 0; j < 300; j += 37)
      ASSERT_EQ(m.grads[i][j], m.expected_sum(n, i, j)) << i << "," << j;  // summed

  // A state one rank cannot adopt (of other tensors): every rank throws,
  // and keeps its plan.
  const std::vector<int> kept = fresh.plan().order();
  StateDict other = rebuilt;
  if (r == n - 1) other.put_int("reducer/plan/hash", 1);
  std::string what = load_error(fresh, other);
  const std::string last = std::to_string(n - 1);
  if (r == n - 1)
    EXPECT_NE(what.find("rank " + last +
                        ": cannot adopt the saved bucket plan: the saved plan "
                        "is not one of these tensors"),
              std::string::npos)
        << what;
  else
    EXPECT_NE(what.find("rank " + last + " cannot adopt theirs"), std::string::npos) << what;
  EXPECT_EQ(fresh.plan().order(), kept);
  // Inside an iteration: refused on every rank.
  fresh.begin_step();
  what = load_error(fresh, initial);
  EXPECT_NE(what.find("inside iteration 1"), std::string::npos) << what;
  fresh.synchronize();
  EXPECT_EQ(fresh.plan().order(), kept);
  if (n > 1) {
    // Rank 0 holds another run's plan than the others: every rank throws.
    what = load_error(fresh, r == 0 ? initial : rebuilt);
    const std::string others = n == 2   ? "rank 1"
                               : n == 3 ? "ranks 1,2"
                                        : "ranks 1-" + last;  // as errors list them
    EXPECT_NE(what.find("the plan of " + others + " differs from rank 0's"), std::string::npos)
        << what;
    EXPECT_EQ(fresh.plan().order(), kept);
  }
  // The initial plan, adopted back: the rebuild after the first step is
  // to come again, as in the saved Reducer before its first iteration.
  fresh.load_state_dict(initial);
  EXPECT_EQ(fresh.plan().hash(m.specs), initial_hash);
  EXPECT_EQ(fresh.plan_version(), 2u);
  run_iteration(fresh, m, {0, 2, 1, 3});
  EXPECT_EQ(fresh.plan_version(), 3u);
  EXPECT_EQ(fresh.plan().order(), saved.plan().order());
}

TEST(LocalSgd, AveragesExactlyEveryPeriod) {
  auto comm = test::world();
  const int n = comm->size(), r = comm->rank();
  Model m({64});
  auto algo = std::make_shared<LocalSgd>(LocalSgdOptions{3, 2});
  Reducer reducer(comm, m.specs, algo, ExecContext::host());
  Sgd sgd(SgdOptions{1.0f});
  std::fill(m.params[0].begin(), m.params[0].end(), 0.0f);
  for (int step = 0; step < 9; ++step) {
    // Gradient = -(rank + 1): every rank drifts by its own amount per step.
    std::fill(m.grads[0].begin(), m.grads[0].end(), -static_cast<float>(r + 1));
    reducer.begin_step();
    reducer.mark_ready(0);
    reducer.synchronize();
    reducer.optimizer_step(sgd);
    const float mean_drift = static_cast<float>(n + 1) / 2.0f;
    // Warmup (steps 0, 1): gradients averaged, every rank moves by the mean.
    // Then local steps, averaged after local steps 3 and 6 (steps 4 and 7).
    float want;
    if (step < 2) {
      want = mean_drift * (step + 1);
    } else {
      const int local = step - 1;  // local steps done
      const int synced = (local / 3) * 3;
      want = mean_drift * 2 + mean_drift * synced + static_cast<float>(r + 1) * (local - synced);
    }
    for (float p : m.params[0]) ASSERT_EQ(p, want) << "step " << step;
    EXPECT_EQ(reducer.algorithm().need_reset(StepInfo{reducer.step()}), reducer.step() == 2);
  }
  EXPECT_EQ(algo->averages(), 2);
}

TEST(Hierarchical, EqualsFlatUnderEmulatedNodes) {
  auto comm = test::world();
  const int n = comm->size(), r = comm->rank();
  Model flat({5000, 17}), hier({5000, 17});
  Reducer a(comm, flat.specs,
            std::make_shared<GradientAllreduce>(GradientAllreduceOptions{true, false}),
            ExecContext::host());
  Reducer b(comm, hier.specs,
            std::make_shared<GradientAllreduce>(GradientAllreduceOptions{true, true}),
            ExecContext::host(), {}, Tunables::from_env());
  flat.fill(r);
  hier.fill(r);
  for (Reducer* red : {&a, &b}) {
    red->begin_step();
    red->mark_ready(0);
    red->mark_ready(2);
    red->synchronize();
  }
  for (size_t i = 0; i < 2; ++i)
    for (size_t j = 0; j < flat.grads[i].size(); ++j) {
      ASSERT_EQ(hier.grads[i][j], flat.grads[i][j]);
      ASSERT_EQ(flat.grads[i][j], flat.expected_sum(n, i, j) / static_cast<float>(n));
    }
}

// The bytes this rank's transport sends for `steps` steps of a model of
// 100000 f32 gradients under `algorithm` (agreements included), and the
// largest difference between a reduced gradient and the exact average.
struct RunBytes {
  uint64_t bytes = 0;
  double max_error = 0;
};
RunBytes bytes_per_run(const AlgorithmPtr& algorithm, int steps) {
  auto counter = std::make_shared<TrafficCounter>(test::world());
  const int n = counter->size();
  Model m({60000, 40000});
  Reducer reducer(counter, m.specs, algorithm, ExecContext::host());
  RunBytes r;
  const uint64_t before = counter->bytes_sent();
  for (int step = 0; step < steps; ++step) {
    m.fill(counter->rank(), step);
    reducer.begin_step();
    reducer.mark_ready(2);
    reducer.mark_ready(0);
    reducer.synchronize();
    for (size_t i = 0; i < m.grads.size(); ++i)
      for (size_t j = 0; j < m.grads[i].size(); ++j)
        r.max_error = std::max(r.max_error,
                               std::fabs(static_cast<double>(m.grads[i][j]) -
                                         static_cast<double>(m.expected_sum(n, i, j, step)) / n));
  }
  r.bytes = counter->bytes_sent() - before;
  return r;
}

// bytegrad's defaults (hierarchical) compress on one machine too: the
// hierarchy would quantize nothing there (an exact reduce within the node,
// an inter-node step of one member), so the flat compressed allreduce runs:
// every value is quantized to 8 bits, and the bytes that travel are those
// of 8-bit payloads (1 + 8 / 2048 bytes per value): about a quarter of an
// f32 ring's 2 (n - 1) / n 4 bytes per value.
TEST(ByteGrad, DefaultsCompressOnOneMachine) {
  auto comm = test::world();
  const int n = comm->size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  if (build_hierarchy(*comm, Tunables::from_env()).layout.num_nodes > 1)
    GTEST_SKIP() << "one machine only (RELAXCC_RANKS_PER_NODE emulates several)";
  constexpr int kSteps = 3;
  const RunBytes defaults = bytes_per_run(std::make_shared<algorithms::ByteGrad>(), kSteps);
  algorithms::ByteGradOptions flat;
  flat.hierarchical = false;
  const RunBytes flat_run = bytes_per_run(std::make_shared<algorithms::ByteGrad>(flat), kSteps);
  const double f32_ring = 2.0 * (n - 1) / n * 4.0 * 100000 * kSteps;
  EXPECT_EQ(defaults.bytes, flat_run.bytes);
  EXPECT_GT(static_cast<double>(defaults.bytes), 0.2 * f32_ring) << defaults.bytes;
  EXPECT_LT(static_cast<double>(defaults.bytes), 0.3 * f32_ring) << defaults.bytes;
  // Quantized: not the exact average, and the same values as the flat mode.
  EXPECT_GT(defaults.max_error, 0.0);
  EXPECT_EQ(defaults.max_error, flat_run.max_error);
}

// Buckets of equal size, marked with random per-rank delays, over many steps:
// every stage of every bucket's hierarchical allreduce must take the same
// place in each communicator's order on every rank, or buckets mix.
TEST(Hierarchical, EqualBucketsWithRandomDelaysStayInOrder) {
  auto comm = test::world();
  const int n = comm->size(), r = comm->rank();
  constexpr int kTensors = 6, kSteps = 40;
  constexpr int64_t kElems = 2048;
  Model m(std::vector<int64_t>(kTensors, kElems));
  ReducerOptions o = fixed_buckets(kElems * 4);
  o.timeout = 20s;
  Reducer reducer(comm, m.specs,
                  std::make_shared<GradientAllreduce>(GradientAllreduceOptions{false, true}),
                  ExecContext::host(), o);
  ASSERT_EQ(reducer.plan().buckets().size(), static_cast<size_t>(kTensors));
  std::mt19937 rng(1234 + 77 * r);
  std::uniform_int_distribution<int> delay_us(0, 1500);
  for (int step = 0; step < kSteps; ++step) {
    m.fill(r, step);
    reducer.begin_step();
    for (int i = kTensors - 1; i >= 0; --i) {
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
      reducer.mark_ready(Model::grad_index(i));
    }
    reducer.synchronize();
    for (int i = 0; i < kTensors; ++i)
      for (int64_t j = 0; j < kElems; ++j)
        ASSERT_EQ(m.grads[i][j], m.expected_sum(n, i, j, step))
            << "step " << step << " tensor " << i << " element " << j;
  }
}

TEST(Reducer, BadInputRaisesClearErrors) {
  auto comm = test::world();
  Model m({10, 10});
  Reducer reducer(comm, m.specs, std::make_shared<GradientAllreduce>(), ExecContext::host());
  reducer.begin_step();
  EXPECT_THROW(reducer.mark_ready(99), InvalidArgument);
  EXPECT_THROW(reducer.mark_ready("nope"), InvalidArgument);
  EXPECT_THROW(reducer.mark_ready(1), InvalidArgument);  // a parameter
  reducer.mark_ready(0);
  try {
    reducer.mark_ready(0);
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'g0' marked ready twice"), std::string::npos) << e.what();
  }
  reducer.mark_ready(2);
  reducer.synchronize();
  if (comm->size() > 1) {
    // Ranks that register different tensors fail at construction, everywhere.
    Model other({10, comm->rank() == 1 ? 11 : 10});
    try {
      Reducer bad(comm, other.specs, std::make_shared<GradientAllreduce>(), ExecContext::host());
      FAIL() << "no throw";
    } catch (const PeerMismatch& e) {
      EXPECT_NE(std::string(e.what()).find("tensor #2"), std::string::npos) << e.what();
    }
  }
}

// The message of the PeerMismatch that constructing a Reducer over `specs`
// throws ("" when it does not throw).
std::string construction_mismatch(const std::vector<TensorSpec>& specs) {
  try {
    Reducer bad(test::world(), specs, std::make_shared<GradientAllreduce>(), ExecContext::host());
  } catch (const PeerMismatch& e) {
    return e.what();
  }
  return "";
}

TEST(Reducer, PlanMismatchNamesBothRanksAndBothTensors) {
  auto comm = test::world();
  const int n = comm->size(), r = comm->rank();
  if (n == 1) GTEST_SKIP() << "a single rank agrees with itself";
  const std::string prefix = "Reducer: ranks registered different tensors: ";
  {
    // Rank 1's g1 has another shape; every rank raises the same message.
    Model m({10, r == 1 ? 11 : 10});
    const std::string what = construction_mismatch(m.specs);
    EXPECT_NE(
        what.find(
            prefix +
            "tensor #2 is 'g1' (11 x f32) on rank 1 but 'g1' (10 x f32) on rank 0; rank 1 has "
            "4 tensors, rank 0 has 4"),
        std::string::npos)
        << what;
  }
  {
    // Every rank but 0 has another name and dtype at #1: the lowest rank is named.
    Model m({10});
    std::vector<double> other(10);
    if (r != 0) m.specs[1] = {"q0", TensorView::host(other.data(), 10), TensorRole::parameter};
    const std::string what = construction_mismatch(m.specs);
    EXPECT_NE(
        what.find(
            prefix +
            "tensor #1 is 'q0' (10 x f64) on rank 1 but 'p0' (10 x f32) on rank 0; rank 1 has "
            "2 tensors, rank 0 has 2"),
        std::string::npos)
        << what;
  }
  {
    // The last rank registers a tensor more, or a tensor fewer, than rank 0.
    Model more({10, 20, 5}), fewer({10});
    Model base({10, 20});
    const std::string last = std::to_string(n - 1);
    std::string what = construction_mismatch(r == n - 1 ? more.specs : base.specs);
    EXPECT_NE(
        what.find(prefix + "tensor #4 is 'g2' (5 x f32) on rank " + last +
                  " but does not exist on rank 0; rank " + last + " has 6 tensors, rank 0 has 4"),
        std::string::npos)
        << what;
    what = construction_mismatch(r == n - 1 ? fewer.specs : base.specs);
    EXPECT_NE(what.find(prefix + "tensor #2 does not exist on rank " + last +
                        " but is 'g1' (20 x f32) on rank 0; rank " + last +
                        " has 2 tensors, rank 0 has 4"),
              std::string::npos)
        << what;
  }
  {
    // Same name and shape, another role: the roles are shown.
    Model m({10});
    if (r == 1) m.specs[1].role = TensorRole::gradient;
    const std::string what = construction_mismatch(m.specs);
    EXPECT_NE(
        what.find(
            prefix +
            "tensor #1 is 'p0' (10 x f32, gradient) on rank 1 but 'p0' (10 x f32, parameter) on "
            "rank 0"),
        std::string::npos)
        << what;
  }
  // Ranks that agree construct normally afterwards.
  Model m({10});
  EXPECT_EQ(construction_mismatch(m.specs), "");
}

// Rank 1 alone registers a name twice: every rank throws InvalidArgument
// at once (not at the timeout), the others naming rank 1 and its error, and
// the communicator stays usable.
TEST(Reducer, ACheckThatFailsOnOneRankFailsEveryRankAtOnce) {
  auto comm = test::world();
  const int r = comm->rank();
  if (comm->size() == 1) GTEST_SKIP() << "needs 2 ranks";
  Model m({10, 10});
  if (r == 1) m.specs[3].name = "p0";
  const auto start = std::chrono::steady_clock::now();
  std::string what;
  try {
    Reducer bad(comm, m.specs, std::make_shared<GradientAllreduce>(), ExecContext::host());
  } catch (const InvalidArgument& e) {
    what = e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_NE(what.find("tensor name 'p0' registered twice"), std::string::npos) << what;
  if (r != 1) {
    EXPECT_NE(what.find("Reducer construction: rank 1 failed"), std::string::npos) << what;
  }
  EXPECT_FALSE(comm->poisoned());
  Model good({10});
  EXPECT_EQ(construction_mismatch(good.specs), "");
}

TEST(Reducer, IterationsCountBackwardPassesAndNameReadinessErrors) {
  auto comm = test::world();
  Model m({10, 10});
  Reducer reducer(comm, m.specs, std::make_shared<GradientAllreduce>(), ExecContext::host());
  Sgd sgd(SgdOptions{0.1f});
  // Iteration 0 (with an optimizer step), 1 (begun implicitly), 2 (no_sync).
  reducer.begin_step();
  reducer.mark_ready(0);
  reducer.mark_ready(2);
  reducer.synchronize();
  reducer.optimizer_step(sgd);
  reducer.mark_ready(2);
  reducer.synchronize();
  reducer.set_no_sync(true);
  reducer.begin_step();
  reducer.mark_ready(0);
  reducer.synchronize();
  reducer.set_no_sync(false);
  EXPECT_EQ(reducer.iteration(), 3);
  EXPECT_EQ(reducer.step(), 1);
  reducer.begin_step();
  try {
    reducer.begin_step();
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "Reducer: begin_step inside iteration 3, which synchronize() has not ended"),
              std::string::npos)
        << e.what();
  }
  reducer.mark_ready(0);
  try {
    reducer.mark_ready(0);
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "Reducer: tensor 'g0' marked ready twice in iteration 3 (iterations count "
                  "backward passes since construction, from 0, each ended by synchronize(); "
                  "optimizer steps so far: 1)"),
              std::string::npos)
        << e.what();
  }
  reducer.mark_ready(2);
  reducer.synchronize();
  EXPECT_EQ(reducer.iteration(), 4);
  EXPECT_EQ(reducer.step(), 1);
}

// Captures what this process writes to stderr (file descriptor 2), where
// RELAXCC_LOG writes, from construction to finish().
class StderrCapture {
 public:
  StderrCapture() : file_(std::tmpfile()) {
    std::fflush(stderr);
    saved_ = dup(2);
    dup2(fileno(file_), 2);
  }
  ~StderrCapture() {
    if (file_) finish();
  }
  std::string finish() {
    std::fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    std::string out;
    std::rewind(file_);
    char buf[4096];
    for (size_t got; (got = std::fread(buf, 1, sizeof buf, file_)) > 0;) out.append(buf, got);
    std::fclose(file_);
    file_ = nullptr;
    return out;
  }

 private:
  std::FILE* file_;
  int saved_ = -1;
};

size_t occurrences(const std::string& text, const std::string& what) {
  size_t count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

TEST(Reducer, TensorMarkedOnSomeRanksOnlyIsWarnedOncePerTensor) {
  auto comm = test::world();
  const int n = comm->size(), r = comm->rank();
  if (n == 1) GTEST_SKIP() << "a single rank marks a tensor everywhere or nowhere";
  Model m({100, 100, 100});
  Reducer reducer(comm, m.specs,
                  std::make_shared<GradientAllreduce>(GradientAllreduceOptions{false, false}),
                  ExecContext::host());
  const LogLevel level = log_level();
  set_log_level(LogLevel::warn);
  StderrCapture capture;
  for (int iteration = 0; iteration < 3; ++iteration) {
    m.fill(r, iteration);
    reducer.begin_step();
    // g0: forgotten by the last rank from iteration 1 on; g1: by rank 0
    // always; g2: unused everywhere (no warning).
    if (r != n - 1 || iteration == 0) reducer.mark_ready(Model::grad_index(0));
    if (r != 0) reducer.mark_ready(Model::grad_index(1));
    reducer.synchronize();
  }
  const std::string logged = capture.finish();
  set_log_level(level);
  // "rank 1", "ranks 1,2", "ranks 1-3"; "rank 0", "ranks 0,1", "ranks 0-2".
  auto span = [](int lo, int hi) {
    if (lo == hi) return "rank " + std::to_string(lo);
    return "ranks " + std::to_string(lo) + (hi == lo + 1 ? "," : "-") + std::to_string(hi);
  };
  const std::string g1 =
      "Reducer: tensor 'g1' was marked ready on " + span(1, n - 1) +
      " but not on rank 0 in iteration 0: where it was not marked it counts as unused";
  const std::string g0 = "Reducer: tensor 'g0' was marked ready on " + span(0, n - 2) +
                         " but not on rank " + std::to_string(n - 1) + " in iteration 1";
  if (r == 0) {
    EXPECT_EQ(occurrences(logged, g1), 1u) << logged;
    EXPECT_EQ(occurrences(logged, g0), 1u) << logged;
    EXPECT_EQ(occurrences(logged, "relaxcc WARN Reducer: tensor '"), 2u) << logged;
  } else {
    EXPECT_EQ(logged.find("Reducer: tensor '"), std::string::npos) << logged;  // rank 0 warns
  }
  // The warning changes nothing: g1 is what the other ranks contributed.
  for (size_t j = 0; j < 100; j += 11) ASSERT_EQ(m.grads[1][j], m.expected_sum(n, 1, j, 2, 0));
}

// Gradient allreduce in the steps where `local` is unset; local steps
// (reduces_gradients false) communicate nothing.
class LocalOrAllreduce final : public Algorithm {
 public:
  std::string name() const override { return "local or allreduce"; }
  AlgorithmCapabilities capabilities() const override { return {}; }
  void init(const AlgorithmContext& ctx) override { inner_.init(ctx); }
  bool reduces_gradients(const StepInfo&) const override { return !local; }
  WorkPtr on_bucket_ready(const StepInfo& s, int bucket, const TensorView& data) override {
    ++dispatched;
    return local ? nullptr : inner_.on_bucket_ready(s, bucket, data);
  }
  bool local = true;
  int dispatched = 0;

 private:
  GradientAllreduce inner_{GradientAllreduceOptions{false, false}};
};

// Local steps run no collective of the Reducer's own: ranks take different
// numbers of them (rank r takes r + 1, each with a tensor unused on some
// ranks), and the communicating step after them still pairs every rank's
// collectives (an agreement in a local step would leave them unpaired: a
// Timeout). A tensor not marked in a local step is untouched here, gradient
// and parameter; marked ones are stepped with this rank's own gradient,
// which the Reducer leaves as it is. The communicating step settles unused
// tensors by agreement as before.
TEST(Reducer, LocalStepsSettleUnusedTensorsWithoutCollectives) {
  auto comm = test::world();
  const int n = comm->size(), r = comm->rank();
  Model m({100, 100, 100});
  auto algo = std::make_shared<LocalOrAllreduce>();
  ReducerOptions o = fixed_buckets(400);  // one bucket per tensor
  o.timeout = 5s;
  Reducer reducer(comm, m.specs, algo, ExecContext::host(), o);
  ASSERT_EQ(reducer.plan().buckets().size(), 3u);
  Sgd sgd(SgdOptions{1.0f});
  for (auto& p : m.params) std::fill(p.begin(), p.end(), 0.0f);
  const LogLevel level = log_level();
  set_log_level(LogLevel::warn);
  StderrCapture capture;
  for (int step = 0; step <= r; ++step) {
    m.fill(r, step);
    reducer.begin_step();
    reducer.mark_ready(Model::grad_index(0));
    if (r % 2 == 1) reducer.mark_ready(Model::grad_index(1));  // unused on even ranks
    reducer.synchronize();
    reducer.optimizer_step(sgd);
    for (size_t j = 0; j < 100; ++j) {
      ASSERT_EQ(m.grads[0][j], static_cast<float>(test::encode(r, j + step))) << "step " << step;
      ASSERT_EQ(m.grads[2][j], static_cast<float>(test::encode(r, j + 14 + step)));  // untouched
    }
  }
  const std::string logged = capture.finish();
  set_log_level(level);
  EXPECT_EQ(logged.find("Reducer: tensor '"), std::string::npos) << logged;
  EXPECT_EQ(algo->dispatched, 3 * (r + 1));  // every bucket handed over in every local step
  for (size_t j = 0; j < 100; ++j) {
    float own0 = 0, own1 = 0;
    for (int step = 0; step <= r; ++step) {
      own0 -= static_cast<float>(test::encode(r, j + step));
      if (r % 2 == 1) own1 -= static_cast<float>(test::encode(r, j + 7 + step));
    }
    ASSERT_EQ(m.params[0][j], own0);
    ASSERT_EQ(m.params[1][j], own1);  // even ranks: never stepped
    ASSERT_EQ(m.params[2][j], 0.0f);
  }
  // A communicating step: the agreement pairs every rank again.
  algo->local = false;
  m.fill(r, 10);
  std::fill(m.grads[2].begin(), m.grads[2].end(), 42.0f);
  reducer.begin_step();
  reducer.mark_ready(Model::grad_index(0));
  if (r % 2 == 1) reducer.mark_ready(Model::grad_index(1));
  reducer.synchronize();
  for (size_t j = 0; j < 100; ++j) {
    ASSERT_EQ(m.grads[0][j], m.expected_sum(n, 0, j, 10));
    float odd = 0;
    for (int q = 1; q < n; q += 2) odd += static_cast<float>(test::encode(q, j + 7 + 10));
    if (n > 1) {
      ASSERT_EQ(m.grads[1][j], odd);  // even ranks contributed zeros
    } else {
      ASSERT_EQ(m.grads[1][j], static_cast<float>(test::encode(0, j + 7 + 10)));  // unused: kept
    }
    ASSERT_EQ(m.grads[2][j], 42.0f);  // unused everywhere
  }
}

// A rank configured differently (bucket tuning on rank 0 only) runs other
// internal collectives: the PeerMismatch names what each was for.
TEST(Reducer, InternalCollectivesNameWhatTheyAreFor) {
  auto comm = test::world();
  const int n = comm->size(), r = comm->rank();
  if (n == 1) GTEST_SKIP() << "a single rank cannot disagree";
  Model m({10});
  ReducerOptions o;
  o.auto_tune_buckets = r == 0;  // rank 0 agrees on bucket memory once more
  try {
    Reducer reducer(comm, m.specs, std::make_shared<GradientAllreduce>(), ExecContext::host(), o);
    reducer.begin_step();
    reducer.synchronize();  // g0 unused: nothing on the wire but the agreement
    FAIL() << "no throw";
  } catch (const PeerMismatch& e) {
    const std::string what = e.what();
    if (r == 0) {
      EXPECT_NE(what.find("of 'Reducer: agreement on bucket memory (node-shared or ordinary)'"),
                std::string::npos)
          << what;
    } else {
      // Rank 1 is in the agreement that ends construction (collective_setup.h).
      EXPECT_NE(what.find("of 'Reducer construction: agreement on every rank's outcome'"),
                std::string::npos)
          << what;
    }
  }
}

// A rank late past the timeout: the Timeout names the agreement it was in.
TEST(Reducer, TimeoutNamesTheAgreement) {
  auto comm = test::world();
  const int n = comm->size(), r = comm->rank();
  if (n == 1) GTEST_SKIP() << "a single rank waits for nobody";
  Model m({10});
  ReducerOptions o;
  o.timeout = 1s;
  MPI_Barrier(MPI_COMM_WORLD);
  int timed_out = 0;
  {
    Reducer reducer(comm, m.specs, std::make_shared<GradientAllreduce>(), ExecContext::host(), o);
    reducer.begin_step();
    if (r == 1) std::this_thread::sleep_for(3s);
    const std::string label = "Reducer: agreement on unused tensors of iteration 0";
    try {
      reducer.synchronize();
      FAIL() << "no throw";
    } catch (const Timeout& e) {
      timed_out = 1;
      EXPECT_NE(std::string(e.what()).find("allreduce #6 of '" + label + "'"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("did not complete within 1000 ms"), std::string::npos)
          << e.what();
    } catch (const CommunicationError& e) {  // told by a rank that timed out
      EXPECT_NE(std::string(e.what()).find(label), std::string::npos) << e.what();
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, &timed_out, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_GE(timed_out, 1);
}

// Rejects bucket 1 while `reject` is set (on every rank alike).
class RejectingAllreduce final : public Algorithm {
 public:
  std::string name() const override { return "rejecting"; }
  AlgorithmCapabilities capabilities() const override { return {}; }
  void init(const AlgorithmContext& ctx) override { inner_.init(ctx); }
  WorkPtr on_bucket_ready(const StepInfo& s, int bucket, const TensorView& data) override {
    if (reject && bucket == 1) RELAXCC_THROW(InvalidArgument, "bucket 1 rejected");
    return inner_.on_bucket_ready(s, bucket, data);
  }
  bool reject = true;

 private:
  GradientAllreduce inner_{GradientAllreduceOptions{false, false}};
};

TEST(Reducer, CopyThreadErrorsReachSynchronize) {
  // Copied gradients: buckets are dispatched by the copy thread, so an error
  // there surfaces in synchronize(), and the next step runs normally.
  auto comm = test::world();
  const int n = comm->size();
  Model m({1000, 1000, 1000});
  auto algo = std::make_shared<RejectingAllreduce>();
  Reducer reducer(comm, m.specs, algo, ExecContext::host(), fixed_buckets(4000));
  ASSERT_EQ(reducer.plan().buckets().size(), 3u);
  m.fill(comm->rank());
  reducer.begin_step();
  for (int i = 2; i >= 0; --i) reducer.mark_ready(Model::grad_index(i));
  try {
    reducer.synchronize();
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("bucket 1 rejected"), std::string::npos) << e.what();
  }
  algo->reject = false;
  m.fill(comm->rank(), 1);
  reducer.begin_step();
  for (int i = 2; i >= 0; --i) reducer.mark_ready(Model::grad_index(i));
  reducer.synchronize();
  for (size_t i = 0; i < 3; ++i)
    for (size_t j = 0; j < 1000; j += 97)
      ASSERT_EQ(m.grads[i][j], m.expected_sum(n, i, j, 1)) << i << "," << j;
}

TEST(StateDicts, SaveLoadRoundTrip) {
  Adam adam(AdamOptions{0.1f});
  std::vector<float> p(100, 1.0f), g(100, 0.5f);
  adam.update(TensorView::host(p.data(), 100), TensorView::host(g.data(), 100), 7);
  adam.finish_step();
  const auto bytes = adam.state_dict().serialize();
  Adam restored(AdamOptions{0.1f});
  restored.load_state_dict(StateDict::deserialize(bytes));
  std::vector<float> p2 = p;
  adam.update(TensorView::host(p.data(), 100), TensorView::host(g.data(), 100), 7);
  restored.update(TensorView::host(p2.data(), 100), TensorView::host(g.data(), 100), 7);
  EXPECT_EQ(p, p2);
  EXPECT_EQ(restored.steps(), 1);
  auto corrupt = bytes;
  corrupt.resize(corrupt.size() - 3);
  EXPECT_THROW(StateDict::deserialize(corrupt), CorruptPayload);
  LocalSgd a(LocalSgdOptions{2, 0}), b;
  StateDict sd = a.state_dict();
  sd.put_int("local_sgd/averages", 5);
  b.load_state_dict(StateDict::deserialize(sd.serialize()));
  EXPECT_EQ(b.averages(), 5);
  // SGD with Nesterov momentum follows PyTorch's update.
  Sgd sgd(SgdOptions{0.1f, 0.9f, 0.0f, 0.0f, true});
  std::vector<float> q{1.0f}, gq{1.0f};
  sgd.update(TensorView::host(q.data(), 1), TensorView::host(gq.data(), 1),
             0);  // b = 1; d = 1 + 0.9
  EXPECT_FLOAT_EQ(q[0], 1.0f - 0.1f * 1.9f);
  sgd.update(TensorView::host(q.data(), 1), TensorView::host(gq.data(), 1),
             0);  // b = 1.9; d = 1 + 1.71
  EXPECT_FLOAT_EQ(q[0], 1.0f - 0.1f * 1.9f - 0.1f * 2.71f);
}

// Device tensors are checked before any communication or CUDA call, so these
// run without a GPU: tensors on two devices and a context on another device
// are InvalidArgument; device tensors over a communicator that moves host
// memory (MPI) are Unsupported, naming the rank, both devices and the NCCL
// communicator. The pointers are never dereferenced.
TEST(Reducer, DeviceTensorsAreCheckedBeforeAnyCommunication) {
  auto comm = test::world();
  const Device gpu = Device::cuda(0);
  auto* fake = reinterpret_cast<float*>(uintptr_t{4096});
  ExecContext on_gpu;
  on_gpu.device = gpu;
  std::vector<TensorSpec> device_specs = {{"g0", TensorView(fake, 8, DType::f32, gpu)},
                                          {"g1", TensorView(fake + 8, 8, DType::f32, gpu)}};
  std::vector<TensorSpec> mixed = device_specs;
  std::vector<float> host(8);
  mixed[1].view = TensorView::host(host.data(), 8);
  try {
    Reducer bad(comm, mixed, std::make_shared<GradientAllreduce>(), on_gpu);
    ADD_FAILURE() << "tensors on two devices were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find("'g1' is on host but tensor 'g0' is on cuda:0"), std::string::npos)
        << e.message();
  }
  try {
    Reducer bad(comm, device_specs, std::make_shared<GradientAllreduce>(), ExecContext::host());
    ADD_FAILURE() << "a host context for device tensors was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find("the tensors are on cuda:0 but the ExecContext is on host"),
              std::string::npos)
        << e.message();
  }
  try {
    Reducer bad(comm, device_specs, std::make_shared<GradientAllreduce>(), on_gpu);
    ADD_FAILURE() << "device tensors over MPI were accepted";
  } catch (const Unsupported& e) {
    EXPECT_NE(e.message().find(detail::concat("rank ", comm->rank(),
                                              "'s tensors are on cuda:0 but its communicator "
                                              "moves memory on host")),
              std::string::npos)
        << e.message();
    EXPECT_NE(e.message().find("NCCL communicator"), std::string::npos) << e.message();
  }
  // Nothing was exchanged: the world communicator is still in step.
  int32_t one = 1;
  comm->allreduce(TensorView::host(&one, 1), ExecContext::host())->wait();
  EXPECT_EQ(one, comm->size());
}

// Device gradients over an NCCL communicator, copied and as bucket views:
// every gradient equals the sum over ranks exactly (small integers that
// encode rank, tensor, element and step; exact in f32) after synchronize()
// and a synchronization of the producer stream, over three steps; the bucket
// views are device memory. Skips without one GPU per rank.
TEST(Reducer, DeviceGradientsOverNcclAreExact) {
  const kernels::CudaAvailability cuda = kernels::cuda_availability();
  if (cuda.device_count == 0) GTEST_SKIP() << "skipped: no CUDA device: " << cuda.reason;
  if (cuda.device_count < test::world_size())
    GTEST_SKIP() << "skipped: " << test::world_size() << " ranks, " << cuda.device_count
                 << " CUDA device(s): NCCL refuses two ranks on one GPU";
  const int device = test::world_rank() % cuda.device_count;
  NcclCommunicatorOptions no;
  no.device = device;
  no.bootstrap = test::world();
  no.timeout = 60s;
  CommunicatorPtr nccl;
  try {
    nccl = create_nccl_communicator(no);
  } catch (const Unsupported& e) {
    GTEST_SKIP() << "skipped: no NCCL communicator: " << e.message();
  }
  const int n = nccl->size(), r = nccl->rank();
  kernels::cuda::set_device(device);
  std::shared_ptr<void> producer = kernels::cuda::create_stream(device);
  ExecContext exec;
  exec.device = Device::cuda(device);
  exec.stream = producer.get();
  const std::vector<int64_t> sizes = {1000, 33, 70000, 1, 4096};
  for (bool view : {false, true}) {
    std::vector<TensorView> grads, params;
    std::vector<TensorSpec> specs;
    for (size_t i = 0; i < sizes.size(); ++i) {
      grads.push_back(nccl->allocate(sizes[i], DType::f32));
      params.push_back(nccl->allocate(sizes[i], DType::f32));
      specs.push_back({"g" + std::to_string(i), grads.back(), TensorRole::gradient,
                       static_cast<int>(2 * i + 1)});
      specs.push_back({"p" + std::to_string(i), params.back(), TensorRole::parameter});
    }
    ReducerOptions o;
    o.plan.first_cap_bytes = 4096;
    o.plan.cap_bytes = 100000;
    o.gradient_as_bucket_view = view;
    Reducer reducer(nccl, specs,
                    std::make_shared<GradientAllreduce>(GradientAllreduceOptions{false, false}),
                    exec, o);
    for (int step = 0; step < 3; ++step) {
      std::vector<std::vector<float>> values(sizes.size());
      reducer.begin_step();
      for (int i = static_cast<int>(sizes.size()) - 1; i >= 0; --i) {
        auto& v = values[static_cast<size_t>(i)];
        v.resize(static_cast<size_t>(sizes[static_cast<size_t>(i)]));
        for (size_t j = 0; j < v.size(); ++j)
          v[j] = static_cast<float>(test::encode(r, j + 7 * static_cast<size_t>(i) + step));
        // "Backward" computes the gradient on the producer stream.
        const TensorView g = view ? reducer.gradient_view(2 * i) : grads[static_cast<size_t>(i)];
        ASSERT_EQ(g.device, exec.device);
        kernels::cuda::copy_async(g.data, v.data(), g.nbytes(), producer.get());
        reducer.mark_ready(2 * i);
      }
      reducer.synchronize();
      kernels::cuda::synchronize(producer.get());
      for (size_t i = 0; i < sizes.size(); ++i) {
        const TensorView g = reducer.gradient_view(static_cast<int>(2 * i));
        std::vector<float> got(static_cast<size_t>(g.numel));
        kernels::cuda::copy_async(got.data(), g.data, g.nbytes(), producer.get());
        kernels::cuda::synchronize(producer.get());
        for (size_t j = 0; j < got.size(); ++j) {
          float want = 0;
          for (int q = 0; q < n; ++q) want += static_cast<float>(test::encode(q, j + 7 * i + step));
          ASSERT_EQ(got[j], want) << "view " << view << " step " << step << " tensor " << i
                                  << " element " << j;
        }
      }
    }
  }
}

}  // namespace
}  // namespace relaxcc
