// Compressed allreduce (relaxcc/relaxed/compressed_allreduce.h): exact where
// the codec is exact, bitwise identical on every rank, within its stated
// error bound, an error that does not grow with the rank count, error
// feedback that converges and is checkpointed bit for bit, and typed errors
// for bad input and ranks that disagree.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "relaxcc/collectives/shares.h"
#include "relaxcc/errors.h"
#include "relaxcc/mpi_communicator.h"
#include "relaxcc/relaxed/compressed_allreduce.h"
#include "relaxcc/relaxed/sparse_allreduce.h"
#include "relaxcc/topology.h"
#include "relaxed_test_util.h"
#include "test_util.h"

namespace relaxcc {
namespace {

using kernels::CompressorConfig;
using kernels::CompressorKind;
using test::world;

CompressorConfig minmax(int bits, kernels::Rounding rounding = kernels::Rounding::nearest) {
  CompressorConfig c;
  c.kind = CompressorKind::minmax;
  c.bits = bits;
  c.chunk = 256;
  c.rounding = rounding;
  return c;
}

CompressorConfig kind(CompressorKind k) {
  CompressorConfig c;
  c.kind = k;
  return c;
}

// Values in [-1, 1] drawn from (seed, rank).
std::vector<float> uniform(int64_t n, int rank, unsigned seed) {
  std::mt19937 rng(seed * 1000u + static_cast<unsigned>(rank));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& e : v) e = u(rng);
  return v;
}

// The exact sum over ranks of uniform(n, r, seed), in double.
std::vector<double> exact_sum(int64_t n, int ranks, unsigned seed) {
  std::vector<double> s(static_cast<size_t>(n), 0.0);
  for (int r = 0; r < ranks; ++r) {
    const std::vector<float> v = uniform(n, r, seed);
    for (size_t i = 0; i < s.size(); ++i) s[i] += v[i];
  }
  return s;
}

// The default segment (one per call here) and small ones: several segments
// of the smallest pieces (16384 elements) for the larger tensors.
constexpr int64_t kSegmentBytes[] = {int64_t{1} << 20, 64, 1000};

// Small integers (rank, index) whose sums over 4 ranks stay exact in f16 and
// bf16.
TEST(CompressedAllreduce, ExactWhereTheCodecIsExact) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  for (CompressorKind k : {CompressorKind::f16, CompressorKind::bf16}) {
    for (int64_t count : {int64_t{1}, int64_t{3}, int64_t{1000}, int64_t{4099}, int64_t{70001}}) {
      for (int64_t segment : kSegmentBytes) {
        std::vector<float> x(static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i) x[i] = static_cast<float>(test::encode(me, i));
        CompressedAllreduceOptions o;
        o.codec = kind(k);
        o.segment_bytes = segment;
        compressed_allreduce(*comm, TensorView::host(x.data(), count), ExecContext::host(), o)
            ->wait();
        for (int64_t i = 0; i < count; ++i) {
          int64_t want = 0;
          for (int r = 0; r < n; ++r) want += test::encode(r, i);
          ASSERT_EQ(x[i], static_cast<float>(want))
              << kernels::compressor_name(k) << " count " << count << " segment " << segment
              << " index " << i;
        }
      }
    }
  }
}

// Every rank decodes the same bytes: results are bitwise identical, for
// every codec, stochastic rounding included.
TEST(CompressedAllreduce, BitwiseIdenticalOnEveryRank) {
  auto comm = world();
  const int me = comm->rank();
  const int64_t count = 70001;  // several segments of the smallest pieces
  for (const CompressorConfig& codec :
       {minmax(8), minmax(4, kernels::Rounding::stochastic), minmax(1), kind(CompressorKind::f16),
        kind(CompressorKind::bf16), kind(CompressorKind::sign)}) {
    for (int64_t segment : kSegmentBytes) {
      std::vector<float> x = uniform(count, me, 7);
      CompressedAllreduceOptions o;
      o.codec = codec;
      o.op = ReduceOp::avg;
      o.segment_bytes = segment;
      ExecContext ctx = ExecContext::host();
      ctx.rng.seed = 42;
      compressed_allreduce(*comm, TensorView::host(x.data(), count), ctx, o)->wait();
      ASSERT_EQ(test::rank_that_differs(*comm, x), -1)
          << kernels::compressor_name(codec.kind) << " " << codec.bits << " bits, segment "
          << segment << ", rank " << me;
    }
  }
}

// The bytes counted per peer agree between the two ends of every pair
// (what rank i sent j is what j received from i), over many segments, and
// lie within what the transport moved (which adds its own headers).
TEST(CompressedAllreduce, StatsAgreeAcrossPeersAndWithTheTransport) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int64_t count = 200000;  // several segments of the smallest pieces with 16000
  for (int64_t segment : {int64_t{1} << 20, int64_t{16000}}) {
    RelaxedStats stats;
    std::vector<float> x = uniform(count, me, 3);
    CompressedAllreduceOptions o;
    o.codec = minmax(8);
    o.segment_bytes = segment;
    o.stats = &stats;
    const CommStats before = comm->stats();
    compressed_allreduce(*comm, TensorView::host(x.data(), count), ExecContext::host(), o)->wait();
    const CommStats after = comm->stats();
    const RelaxedCounts c = stats.counts();
    EXPECT_EQ(test::counts_that_disagree(*comm, c), "") << "segment " << segment;
    const uint64_t moved = after.bytes_sent - before.bytes_sent;
    EXPECT_LE(c.bytes_sent, moved) << "segment " << segment;
    // Per message at most a header message of 4 KiB rides along.
    EXPECT_GE(c.bytes_sent + 4096 * 4 * n * (1 + count * 4 / segment), moved)
        << "segment " << segment;
  }
}

// minmax with b bits, round to nearest: a value of range w in its chunk is
// off by at most w / (2^b - 1) / 2. Each rank's values lie in [-1, 1]
// (worker side: at most 1 / (2^b - 1) each), the sum of n of them in
// [-n, n] (server side: at most n / (2^b - 1)), so the sum is off by at most
// 2n / (2^b - 1). f16 and bf16: a relative 2^-11 and 2^-8 per rounding.
TEST(CompressedAllreduce, WithinTheCodecsErrorBound) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  const int64_t count = 3000;
  const std::vector<double> exact = exact_sum(count, n, 11);
  for (int bits : {8, 4, 2, 1}) {
    std::vector<float> x = uniform(count, me, 11);
    CompressedAllreduceOptions o;
    o.codec = minmax(bits);
    compressed_allreduce(*comm, TensorView::host(x.data(), count), ExecContext::host(), o)->wait();
    const double bound = 2.0 * n / ((1 << bits) - 1) * (1 + 1e-5) + 1e-5;
    for (int64_t i = 0; i < count; ++i)
      ASSERT_LE(std::abs(x[i] - exact[i]), bound) << bits << " bits, index " << i;
  }
  for (auto [k, eps] : {std::pair{CompressorKind::f16, 0x1p-11}, {CompressorKind::bf16, 0x1p-8}}) {
    std::vector<float> x = uniform(count, me, 11);
    CompressedAllreduceOptions o;
    o.codec = kind(k);
    compressed_allreduce(*comm, TensorView::host(x.data(), count), ExecContext::host(), o)->wait();
    // n worker roundings of values <= 1, one server rounding of the sum.
    for (int64_t i = 0; i < count; ++i)
      ASSERT_LE(std::abs(x[i] - exact[i]), eps * (n + std::abs(exact[i])) * (1 + 1e-3) + 1e-6)
          << kernels::compressor_name(k) << " index " << i;
  }
}

// The error of the average does not grow with the ring's length: 8 ranks
// against 2 of them, on data that shares its average (a common base plus a
// small rank-dependent part).
TEST(CompressedAllreduce, ErrorDoesNotGrowWithRanks) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  if (n < 4) GTEST_SKIP() << "compares 2 ranks with " << n;
  const int64_t count = 8192;
  const std::vector<float> base = uniform(count, 1000, 3);
  const auto data = [&](int r) {
    std::vector<float> v = uniform(count, r, 5);
    for (size_t i = 0; i < v.size(); ++i) v[i] = base[i] + 0.05f * v[i];
    return v;
  };
  const auto relative_error = [&](Communicator& c, const std::vector<int>& ranks) {
    std::vector<float> x = data(me);
    CompressedAllreduceOptions o;
    o.codec = minmax(4);
    o.op = ReduceOp::avg;
    compressed_allreduce(c, TensorView::host(x.data(), count), ExecContext::host(), o)->wait();
    double diff = 0, norm = 0;
    std::vector<double> avg(static_cast<size_t>(count), 0.0);
    for (int r : ranks) {
      const std::vector<float> v = data(r);
      for (size_t i = 0; i < avg.size(); ++i) avg[i] += v[i] / ranks.size();
    }
    for (size_t i = 0; i < avg.size(); ++i) {
      diff += (x[i] - avg[i]) * (x[i] - avg[i]);
      norm += avg[i] * avg[i];
    }
    return std::sqrt(diff / norm);
  };
  std::vector<int> everyone(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) everyone[r] = r;
  const double err_all = relative_error(*comm, everyone);
  if (me < 2) {
    GroupOptions g;
    g.key = 77;
    CommunicatorPtr pair = comm->group({0, 1}, g);
    const double err_two = relative_error(*pair, {0, 1});
    EXPECT_LE(err_all, 1.1 * err_two) << n << " ranks: " << err_all << ", 2 ranks: " << err_two;
  }
  comm->barrier()->wait();
}

// Error feedback: with the same tensor every step, the sum of the results
// tracks steps x the exact sum (the residuals carry what compression
// dropped), where without it the error of every step adds up.
TEST(CompressedAllreduce, ErrorFeedbackConverges) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  const int64_t count = 2048;
  const std::vector<double> exact = exact_sum(count, n, 13);
  const int steps = 40;
  const auto accumulated_error = [&](CompressedAllreduceState* state) {
    std::vector<double> total(static_cast<size_t>(count), 0.0);
    for (int s = 0; s < steps; ++s) {
      std::vector<float> x = uniform(count, me, 13);
      CompressedAllreduceOptions o;
      o.codec = minmax(2);
      o.state = state;
      o.segment_bytes = 2000;
      compressed_allreduce(*comm, TensorView::host(x.data(), count), ExecContext::host(), o)
          ->wait();
      for (size_t i = 0; i < total.size(); ++i) total[i] += x[i];
    }
    double diff = 0, norm = 0;
    for (size_t i = 0; i < total.size(); ++i) {
      diff += (total[i] - steps * exact[i]) * (total[i] - steps * exact[i]);
      norm += steps * exact[i] * steps * exact[i];
    }
    return std::sqrt(diff / norm);
  };
  CompressedAllreduceState state(count, me, n);
  const double with = accumulated_error(&state);
  const double without = accumulated_error(nullptr);
  if (n > 1) {
    EXPECT_LE(with, without / 5) << "with feedback " << with << ", without " << without;
  }
}

// Saving the residuals mid-run and loading them into a fresh state replays
// the same results, bit for bit.
TEST(CompressedAllreduce, CheckpointReplaysBitForBit) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  const int64_t count = 1500;
  const auto run = [&](CompressedAllreduceState& state, int from, int to) {
    std::vector<float> out;
    for (int s = from; s < to; ++s) {
      std::vector<float> x = uniform(count, me, 100 + s);
      CompressedAllreduceOptions o;
      o.codec = minmax(4, kernels::Rounding::stochastic);
      o.state = &state;
      o.segment_bytes = 1000;  // several pieces per shard
      ExecContext ctx = ExecContext::host();
      ctx.rng.seed = 9;
      ctx.rng.offset = static_cast<uint64_t>(s) * count;
      compressed_allreduce(*comm, TensorView::host(x.data(), count), ctx, o)->wait();
      out.insert(out.end(), x.begin(), x.end());
    }
    return out;
  };
  CompressedAllreduceState state(count, me, n);
  run(state, 0, 3);
  StateDict saved;
  state.save(saved, "ef.");
  const std::vector<float> first = run(state, 3, 6);
  CompressedAllreduceState restored(count, me, n);
  restored.load(StateDict::deserialize(saved.serialize()), "ef.");
  const std::vector<float> second = run(restored, 3, 6);
  ASSERT_EQ(first.size(), second.size());
  EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)), 0);
  CompressedAllreduceState other(count + 1, me, n);
  EXPECT_THROW(other.load(saved, "ef."), InvalidArgument);
}

// One rank of n sends garbage (its values sign-flipped and scaled by 100,
// or random values of magnitude up to 1e6). Robust aggregation keeps the
// result near the honest ranks' mean, where a plain average would not be.
TEST(CompressedAllreduce, RobustAggregationUnderAttack) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  if (n < 3) GTEST_SKIP() << "needs 3 ranks (one of them bad)";
  const int64_t count = 4000;
  const int bad = n - 1;
  const std::vector<float> base = uniform(count, 1000, 21);
  const auto honest = [&](int r) {
    std::vector<float> v = uniform(count, r, 22);
    for (size_t i = 0; i < v.size(); ++i) v[i] = base[i] + 0.01f * v[i];
    return v;
  };
  std::vector<double> mean(static_cast<size_t>(count), 0.0);
  std::vector<float> lo(static_cast<size_t>(count), 1e30f), hi(static_cast<size_t>(count), -1e30f);
  for (int r = 0; r < bad; ++r) {
    const std::vector<float> v = honest(r);
    for (size_t i = 0; i < v.size(); ++i) {
      mean[i] += v[i] / bad;
      lo[i] = std::min(lo[i], v[i]);
      hi[i] = std::max(hi[i], v[i]);
    }
  }
  const auto relative_error = [&](const std::vector<float>& x) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      diff += (x[i] - mean[i]) * (x[i] - mean[i]);
      norm += mean[i] * mean[i];
    }
    return std::sqrt(diff / norm);
  };
  for (int attack = 0; attack < 2; ++attack) {
    std::vector<float> mine = honest(me);
    if (me == bad) {
      std::mt19937 rng(5);
      std::uniform_real_distribution<float> huge(-1e6f, 1e6f);
      for (float& v : mine) v = attack == 0 ? -100.0f * v : huge(rng);
    }
    for (bool compressed : {false, true}) {
      const auto run = [&](RobustAggregation::Kind k) {
        std::vector<float> x = mine;
        CompressedAllreduceOptions o;
        if (!compressed) o.codec.reset();
        o.op = ReduceOp::avg;
        o.robust.kind = k;
        o.robust.tau = 0.1;
        compressed_allreduce(*comm, TensorView::host(x.data(), count), ExecContext::host(), o)
            ->wait();
        return x;
      };
      const std::string what = std::string(attack == 0 ? "sign-flipped x100" : "huge random") +
                               (compressed ? ", minmax 8-bit" : ", f32");
      // Trimmed mean: within the honest range, up to the 8-bit codec's
      // rounding of the honest values and of the result (1/255 of each
      // chunk's range, below 2.1, at most).
      const std::vector<float> trimmed = run(RobustAggregation::Kind::trimmed_mean);
      const float slack = compressed ? 2.1f / 255 : 1e-6f;
      for (int64_t i = 0; i < count; ++i)
        ASSERT_TRUE(trimmed[i] >= lo[i] - slack && trimmed[i] <= hi[i] + slack)
            << what << ": index " << i << " = " << trimmed[i] << ", honest range [" << lo[i] << ", "
            << hi[i] << "]";
      // Centered clip: each of its 3 iterations moves at most tau / n
      // towards the bad rank, from the coordinate-wise median.
      EXPECT_LE(relative_error(run(RobustAggregation::Kind::centered_clip)), 0.02) << what;
      // The plain average is far off.
      EXPECT_GE(relative_error(run(RobustAggregation::Kind::none)), 1.0) << what;
    }
  }
}

// Full precision within each node, compressed across nodes (CTest runs this
// at 4 ranks as 2 nodes x 2 too): exact where the codec is, bitwise identical
// everywhere, and concurrent calls keep their order on every communicator.
TEST(CompressedAllreduce, HierarchicalExactAndIdentical) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  const HierarchicalComms h = build_hierarchy(*comm, Tunables::from_env());
  const int64_t count = 3001;
  constexpr int kCalls = 4;
  std::vector<std::vector<float>> xs(kCalls, std::vector<float>(static_cast<size_t>(count)));
  std::vector<WorkPtr> works;
  for (int k = 0; k < kCalls; ++k) {
    for (int64_t i = 0; i < count; ++i) xs[k][i] = static_cast<float>(test::encode(me, i + k));
    CompressedAllreduceOptions o;
    o.codec = kind(CompressorKind::f16);
    works.push_back(hierarchical_compressed_allreduce(
        *comm, h, TensorView::host(xs[k].data(), count), ExecContext::host(), o));
  }
  for (int k = kCalls - 1; k >= 0; --k) works[k]->wait();
  for (int k = 0; k < kCalls; ++k)
    for (int64_t i = 0; i < count; ++i) {
      int64_t want = 0;
      for (int r = 0; r < n; ++r) want += test::encode(r, i + k);
      ASSERT_EQ(xs[k][i], static_cast<float>(want)) << "call " << k << " index " << i;
    }
  std::vector<float> x = uniform(count, me, 31);
  CompressedAllreduceOptions o;
  o.codec = minmax(8);
  o.op = ReduceOp::avg;
  hierarchical_compressed_allreduce(*comm, h, TensorView::host(x.data(), count),
                                    ExecContext::host(), o)
      ->wait();
  const std::vector<double> exact = exact_sum(count, n, 31);
  for (int64_t i = 0; i < count; ++i)
    ASSERT_NEAR(x[i], exact[i] / n, 2.0 * n / 255 / n + 1e-5) << "index " << i;
  ASSERT_EQ(test::rank_that_differs(*comm, x), -1) << "rank " << me;
  o.robust.kind = RobustAggregation::Kind::trimmed_mean;
  EXPECT_THROW(hierarchical_compressed_allreduce(*comm, h, TensorView::host(x.data(), count),
                                                 ExecContext::host(), o),
               InvalidArgument);
}

// One rank's values that its codec refuses (NaN, a value f16 cannot hold),
// or a sum that overflows f32, fail every rank's call, never a hang.
TEST(CompressedAllreduce, OneRanksBadValuesFailEveryRank) {
  const int n = test::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  for (int variant = 0; variant < 4; ++variant) {
    auto comm = create_mpi_communicator();
    const int me = comm->rank();
    std::vector<float> x(1024, 1.0f);
    WorkPtr w;
    if (variant < 3) {
      CompressedAllreduceOptions o;
      if (variant == 0) o.codec = minmax(8);
      if (variant == 1) o.codec = kind(CompressorKind::f16);
      if (variant == 2) o.codec.reset();
      if (me == n - 1) x[100] = variant == 0 ? NAN : variant == 1 ? 1e6f : 3e38f;
      if (variant == 2) x[100] = 3e38f;  // every rank: the sum overflows
      w = compressed_allreduce(*comm, TensorView::host(x.data(), 1024), ExecContext::host(), o);
    } else {
      SparseAllreduceOptions o;
      o.codec.ratio = 1.0;  // keeps everything, the NaN included
      if (me == n - 1) x[100] = NAN;
      w = sparse_allreduce(*comm, TensorView::host(x.data(), 1024), ExecContext::host(), o);
    }
    EXPECT_THROW(w->wait(std::chrono::milliseconds(20000)), Error) << "variant " << variant;
  }
}

TEST(CompressedAllreduce, BadInputIsRejected) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  std::vector<float> x(64, 1.0f);
  std::vector<double> d(64, 1.0);
  const ExecContext& host = ExecContext::host();
  CompressedAllreduceOptions o;
  EXPECT_THROW(compressed_allreduce(*comm, TensorView::host(d.data(), 64), host, o),
               InvalidArgument);
  o.codec = kind(CompressorKind::topk);
  EXPECT_THROW(compressed_allreduce(*comm, TensorView::host(x.data(), 64), host, o),
               InvalidArgument);
  o.codec = minmax(3);
  EXPECT_THROW(compressed_allreduce(*comm, TensorView::host(x.data(), 64), host, o),
               InvalidArgument);
  o.codec = minmax(8);
  o.op = ReduceOp::max;
  EXPECT_THROW(compressed_allreduce(*comm, TensorView::host(x.data(), 64), host, o),
               InvalidArgument);
  o.robust.kind = RobustAggregation::Kind::trimmed_mean;  // with op sum
  EXPECT_THROW(compressed_allreduce(*comm, TensorView::host(x.data(), 64), host, o),
               InvalidArgument);
  o.op = ReduceOp::avg;
  o.robust.trim = (n + 1) / 2;  // 2 trim >= ranks
  EXPECT_THROW(compressed_allreduce(*comm, TensorView::host(x.data(), 64), host, o),
               InvalidArgument);
  o.robust.kind = RobustAggregation::Kind::centered_clip;
  o.robust.tau = 0;
  EXPECT_THROW(compressed_allreduce(*comm, TensorView::host(x.data(), 64), host, o),
               InvalidArgument);
  o.robust = {};
  o.op = ReduceOp::sum;
  o.segment_bytes = 3;  // less than one f32
  EXPECT_THROW(compressed_allreduce(*comm, TensorView::host(x.data(), 64), host, o),
               InvalidArgument);
  o.segment_bytes = CompressedAllreduceOptions{}.segment_bytes;
  CompressedAllreduceState wrong(65, me, n);
  o.state = &wrong;
  EXPECT_THROW(compressed_allreduce(*comm, TensorView::host(x.data(), 64), host, o),
               InvalidArgument);
}

// A failure in a later segment (a value the codec refuses on one rank, in
// the last piece of the last shard; a sum that overflows) fails every rank
// and leaves x and the error-feedback state as they were, although earlier
// segments went through.
TEST(CompressedAllreduce, FailureInALaterSegmentLeavesXAndStateAlone) {
  const int n = test::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int64_t count = 200000;
  for (int variant = 0; variant < 2; ++variant) {
    auto comm = create_mpi_communicator();
    const int me = comm->rank();
    std::vector<float> x = uniform(count, me, 5);
    CompressedAllreduceState state(count, me, n);
    CompressedAllreduceOptions o;
    o.codec = minmax(8);
    o.state = &state;
    o.segment_bytes = 4096;  // pieces of the 16384-element minimum: several segments
    // One good call first, so that the residuals are not zero.
    compressed_allreduce(*comm, TensorView::host(x.data(), count), ExecContext::host(), o)->wait();
    x = uniform(count, me, 6);
    if (variant == 0 && me == n - 1) x[count - 1] = NAN;
    if (variant == 1) x[count - 1] = 3e38f;  // the sum overflows at its owner
    const std::vector<float> x_before = x, worker = state.worker(), server = state.server();
    WorkPtr w =
        compressed_allreduce(*comm, TensorView::host(x.data(), count), ExecContext::host(), o);
    EXPECT_THROW(w->wait(std::chrono::milliseconds(20000)), Error) << "variant " << variant;
    EXPECT_EQ(std::memcmp(x.data(), x_before.data(), x.size() * sizeof(float)), 0)
        << "variant " << variant;
    EXPECT_EQ(state.worker(), worker) << "variant " << variant;
    EXPECT_EQ(state.server(), server) << "variant " << variant;
  }
}

// Ranks that disagree on the codec get an error on every rank, never a hang:
// bits that change the payload's size (the alltoallv's blocks differ), kinds
// of the same size (f16 against bf16: the payload headers differ) and, with
// stochastic rounding, the RNG seed or offset. The last rank disagrees: its
// owner's check names it, and the others fail with it.
TEST(CompressedAllreduce, CodecsThatDifferFailEveryRank) {
  const int n = test::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  for (int variant = 0; variant < 4; ++variant) {
    auto comm = create_mpi_communicator();
    const int me = comm->rank();
    const bool odd = me == n - 1;
    std::vector<float> x = uniform(4096, me, 1);
    CompressedAllreduceOptions o;
    ExecContext ctx = ExecContext::host();
    if (variant == 0) {
      o.codec = minmax(odd ? 4 : 8);
    } else if (variant == 1) {
      o.codec = kind(odd ? CompressorKind::bf16 : CompressorKind::f16);
    } else {
      o.codec = minmax(8, kernels::Rounding::stochastic);
      (variant == 2 ? ctx.rng.seed : ctx.rng.offset) = odd ? 7 : 5;
    }
    WorkPtr w = compressed_allreduce(*comm, TensorView::host(x.data(), 4096), ctx, o);
    if (me == 0 && variant >= 1) {
      // Rank 0 owns shard 0 and reads the odd rank's payload header.
      try {
        w->wait(std::chrono::milliseconds(20000));
        ADD_FAILURE() << "variant " << variant << ": no error";
      } catch (const PeerMismatch& e) {
        EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(n - 1)), std::string::npos)
            << e.what();
      }
    } else {
      EXPECT_THROW(w->wait(std::chrono::milliseconds(20000)), Error) << "variant " << variant;
    }
  }
}

// Unequal shares (the owner schedule with shards split by weight, empty
// shards included, and the owners' payloads sent straight to every rank):
// exactly the equal split's sums where the codec is exact (f32 and f16 on
// small integers), within the codec's bound (minmax 8 bits: 2n / 255 on
// values in [-1, 1]) and bitwise identical on every rank otherwise, bytes
// per peer that agree between the two ends, and an error-feedback state
// made for the same shares.
TEST(CompressedAllreduce, UnequalSharesAreExactAndWithinTheBound) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  for (const std::vector<double>& shares : test::unequal_shares(n)) {
    const std::string split = ::testing::PrintToString(shares);
    for (const std::optional<CompressorConfig>& codec :
         {std::optional<CompressorConfig>{}, std::optional{kind(CompressorKind::f16)}}) {
      for (int64_t count : {int64_t{1}, int64_t{3}, int64_t{4099}, int64_t{70001}}) {
        for (int64_t segment : {int64_t{1} << 20, int64_t{1000}}) {
          std::vector<float> x(static_cast<size_t>(count));
          for (int64_t i = 0; i < count; ++i) x[i] = static_cast<float>(test::encode(me, i));
          CompressedAllreduceOptions o;
          o.codec = codec;
          o.segment_bytes = segment;
          o.shares = shares;
          compressed_allreduce(*comm, TensorView::host(x.data(), count), ExecContext::host(), o)
              ->wait();
          for (int64_t i = 0; i < count; ++i) {
            int64_t want = 0;
            for (int r = 0; r < n; ++r) want += test::encode(r, i);
            ASSERT_EQ(x[i], static_cast<float>(want))
                << (codec ? "f16" : "f32") << " shares " << split << " count " << count
                << " segment " << segment << " index " << i;
          }
        }
      }
    }
    const int64_t count = 70001;
    const std::vector<double> exact = exact_sum(count, n, 5);
    RelaxedStats stats;
    CompressedAllreduceState state(count, me, n, Device::host(), shares);
    std::vector<float> x = uniform(count, me, 5);
    CompressedAllreduceOptions o;
    o.codec = minmax(8);
    o.segment_bytes = 1000;
    o.shares = shares;
    o.stats = &stats;
    o.state = &state;
    compressed_allreduce(*comm, TensorView::host(x.data(), count), ExecContext::host(), o)->wait();
    double worst = 0;
    for (int64_t i = 0; i < count; ++i) worst = std::max(worst, std::fabs(x[i] - exact[i]));
    EXPECT_LE(worst, 2.0 * n / 255 + 1e-5) << "shares " << split;
    EXPECT_EQ(test::rank_that_differs(*comm, x), -1) << "shares " << split;
    EXPECT_EQ(test::counts_that_disagree(*comm, stats.counts()), "") << "shares " << split;
    // A state made for equal shares does not fit another split.
    CompressedAllreduceState equal(count, me, n);
    o.state = &equal;
    if (shard_counts(count, n, shares)[me] != shard_counts(count, n, {})[me]) {
      EXPECT_THROW(
          compressed_allreduce(*comm, TensorView::host(x.data(), count), ExecContext::host(), o),
          InvalidArgument)
          << "shares " << split;
    }
  }
}

// A rank whose shares differ fails every rank instead of mixing shards.
TEST(CompressedAllreduce, SharesThatDifferFailEveryRank) {
  const int n = test::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  auto comm = create_mpi_communicator();
  const int me = comm->rank();
  std::vector<float> x = uniform(4096, me, 1);
  const std::vector<float> before = x;
  CompressedAllreduceOptions o;
  o.codec = minmax(8);
  o.shares.assign(static_cast<size_t>(n), 1.0);
  if (me == n - 1) o.shares[0] = 3.0;
  WorkPtr w = compressed_allreduce(*comm, TensorView::host(x.data(), 4096), ExecContext::host(), o);
  EXPECT_THROW(w->wait(std::chrono::milliseconds(20000)), Error);
  EXPECT_EQ(x, before);  // x is written only once every payload decoded
}

// Shard counts one element apart on the last rank (shard 0 one more, shard 1
// one less): every rank fails with PeerMismatch naming the shard counts, x
// untouched, with an 8-bit codec (whose payload sizes differ too) and with
// the sign codec, whose payloads keep their sizes (8 elements a byte), so
// only the split in the headers tells the ranks apart.
TEST(CompressedAllreduce, SharesOneElementApartFailEveryRankWithPeerMismatch) {
  const int n = test::world_size();
  if (n < 3) GTEST_SKIP() << "needs 3 ranks or more";
  constexpr int64_t kShard = 1004;
  const int64_t count = kShard * n;
  for (const CompressorConfig& codec : {minmax(8), kind(CompressorKind::sign)}) {
    const std::string name = codec.kind == CompressorKind::sign ? "sign" : "minmax8";
    auto comm = world();
    const int me = comm->rank();
    CompressedAllreduceOptions o;
    o.codec = codec;
    o.shares.assign(static_cast<size_t>(n), static_cast<double>(kShard));
    const bool odd = me == n - 1;
    if (odd) {
      o.shares[0] += 1;
      o.shares[1] -= 1;
    }
    std::vector<int64_t> want(static_cast<size_t>(n), kShard);
    if (odd) {
      ++want[0];
      --want[1];
    }
    ASSERT_EQ(shard_counts(count, n, o.shares), want);
    if (codec.kind == CompressorKind::sign) {
      ASSERT_EQ(kernels::encoded_size(kShard + 1, codec), kernels::encoded_size(kShard, codec));
      ASSERT_EQ(kernels::encoded_size(kShard - 1, codec), kernels::encoded_size(kShard, codec));
    }
    std::vector<float> x(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) x[i] = static_cast<float>(test::encode(me, i));
    const std::vector<float> before = x;
    WorkPtr w =
        compressed_allreduce(*comm, TensorView::host(x.data(), count), ExecContext::host(), o);
    try {
      w->wait(std::chrono::milliseconds(20000));
      ADD_FAILURE() << name << ": rank " << me << " completed";
    } catch (const PeerMismatch& e) {
      EXPECT_NE(std::string(e.what()).find("shard counts"), std::string::npos)
          << name << ": " << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << name << ": rank " << me << " failed without PeerMismatch: " << e.what();
    }
    EXPECT_EQ(x, before) << name;
  }
}

}  // namespace
}  // namespace relaxcc
