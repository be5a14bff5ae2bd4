// Pieces of the algorithm modules that the convergence harness does not
// reach: BucketFeedback across plan changes and checkpoints of another plan.
#include <gtest/gtest.h>

#include "relaxcc/algorithms/bucket_feedback.h"
#include "relaxcc/errors.h"

namespace relaxcc::algorithms {
namespace {

// Three gradients of 10, 20 and 30 elements, packed by `cap_bytes`.
struct Layout {
  std::vector<std::vector<float>> data{std::vector<float>(10), std::vector<float>(20),
                                       std::vector<float>(30)};
  std::vector<TensorSpec> specs;
  BucketPlan plan;
  AlgorithmContext ctx;
  explicit Layout(int64_t cap_bytes) {
    for (size_t t = 0; t < data.size(); ++t)
      specs.push_back({"g" + std::to_string(t),
                       TensorView::host(data[t].data(), static_cast<int64_t>(data[t].size()))});
    BucketPlanOptions o;
    o.cap_bytes = cap_bytes;
    o.first_cap_bytes = cap_bytes;
    plan = BucketPlan::build(specs, {}, o);
    ctx.tensors = &specs;
    ctx.plan = &plan;
    ctx.flat_offset = {0, 10, 30};
  }
  // Bucket-relative element of tensor t's element j.
  std::pair<int, int64_t> where(int t, int64_t j) const {
    const auto [b, e] = plan.locate(t);
    return {b, plan.buckets()[static_cast<size_t>(b)].entries[static_cast<size_t>(e)].offset + j};
  }
};

// The owned shard of rank 0 of 2: the first ceil(numel / 2) elements.
int64_t owned_by_rank0(int64_t numel) {
  return numel / 2 + numel % 2;
}

TEST(BucketFeedback, ResidualsFollowTheirTensorsAcrossPlans) {
  Layout one_each(30 * 4);  // each tensor in a bucket of its own, or two together
  Layout together(1 << 20);
  ASSERT_GT(one_each.plan.buckets().size(), 1u);
  ASSERT_EQ(together.plan.buckets().size(), 1u);
  BucketFeedback fb;
  fb.rebind(one_each.ctx, 0, 2, 2.0f);
  // worker residual of tensor t, element j: 100 t + j; server residual 0.5.
  for (int t = 0; t < 3; ++t)
    for (int64_t j = 0; j < static_cast<int64_t>(one_each.data[t].size()); ++j) {
      const auto [b, at] = one_each.where(t, j);
      fb.state(b)->worker()[static_cast<size_t>(at)] = static_cast<float>(100 * t + j);
    }
  for (size_t b = 0; b < one_each.plan.buckets().size(); ++b) {
    std::vector<float>& server = fb.state(static_cast<int>(b))->server();
    ASSERT_EQ(static_cast<int64_t>(server.size()),
              owned_by_rank0(one_each.plan.buckets()[b].numel));
    std::fill(server.begin(), server.end(), 0.5f);
  }
  fb.rebind(together.ctx, 0, 2, 2.0f);
  // Each value moved with its tensor; the server residual came back as
  // 2 * 0.5 on the elements the old bucket's owned shard covered.
  for (int t = 0; t < 3; ++t)
    for (int64_t j = 0; j < static_cast<int64_t>(together.data[t].size()); ++j) {
      const auto [old_b, old_at] = one_each.where(t, j);
      const int64_t old_numel = one_each.plan.buckets()[static_cast<size_t>(old_b)].numel;
      const float want =
          static_cast<float>(100 * t + j) + (old_at < owned_by_rank0(old_numel) ? 1.0f : 0.0f);
      const auto [b, at] = together.where(t, j);
      EXPECT_EQ(fb.state(b)->worker()[static_cast<size_t>(at)], want) << t << " " << j;
    }
  for (float v : fb.state(0)->server()) EXPECT_EQ(v, 0.0f);
  // A bucket whose layout is unchanged keeps its state as it is.
  CompressedAllreduceState* kept = fb.state(0);
  fb.state(0)->server()[0] = 3.0f;
  fb.rebind(together.ctx, 0, 2, 2.0f);
  EXPECT_EQ(fb.state(0), kept);
  EXPECT_EQ(fb.state(0)->server()[0], 3.0f);
}

TEST(BucketFeedback, CheckpointOfAnotherPlanIsInvalidArgument) {
  Layout one_each(30 * 4), together(1 << 20);
  BucketFeedback a, b;
  a.rebind(one_each.ctx, 0, 2, 1.0f);
  b.rebind(together.ctx, 0, 2, 1.0f);
  a.state(0)->worker()[3] = 7.0f;
  StateDict sd;
  a.save(sd, "x/");
  EXPECT_THROW(b.load(sd, "x/"), InvalidArgument);
  BucketFeedback c;
  c.rebind(one_each.ctx, 0, 2, 1.0f);
  c.load(StateDict::deserialize(sd.serialize()), "x/");
  EXPECT_EQ(c.state(0)->worker()[3], 7.0f);
  EXPECT_THROW(c.state(99), InvalidArgument);
}

}  // namespace
}  // namespace relaxcc::algorithms
