// Sparse allreduce (relaxcc/relaxed/sparse_allreduce.h), random-k and top-k:
// exact where nothing is dropped, the largest entries of each shard kept,
// error feedback that loses nothing, bitwise identical results on every
// rank, bytes per rank that do not grow with the ranks, and typed errors on
// every rank (never a hang) for bad input, ranks that disagree and corrupted
// payloads.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "relaxcc/errors.h"
#include "relaxcc/forwarding_communicator.h"
#include "relaxcc/mpi_communicator.h"
#include "relaxcc/relaxed/sparse_allreduce.h"
#include "relaxed_test_util.h"
#include "test_util.h"

namespace relaxcc {
namespace {

using kernels::CompressorConfig;
using kernels::CompressorKind;
using namespace std::chrono_literals;

// ---- random-k ---------------------------------------------------------------

CompressorConfig random_k(kernels::RandomKMode mode, uint64_t seed, uint64_t step) {
  CompressorConfig c;
  c.kind = CompressorKind::randomk;
  c.ratio = 0.1;
  c.random_mode = mode;
  c.seed = seed;
  c.step = step;
  return c;
}

// The kept coordinates hold the exact sum (integers: exact in f32), every
// other one 0, and there are exactly k of them; error feedback keeps the
// rest.
TEST(SparseAllreduce, RandomKIsExactAtTheKeptCoordinates) {
  auto comm = test::world();
  const int n = comm->size(), me = comm->rank();
  const int64_t count = 5003;
  for (auto mode : {kernels::RandomKMode::stratified, kernels::RandomKMode::rolling}) {
    for (uint64_t step : {uint64_t{0}, uint64_t{7}}) {
      std::vector<float> x(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) x[i] = static_cast<float>(test::encode(me, i));
      kernels::ErrorFeedback feedback(count);
      SparseAllreduceOptions o;
      o.codec = random_k(mode, 99, step);
      o.feedback = &feedback;
      sparse_allreduce(*comm, TensorView::host(x.data(), count), ExecContext::host(), o)->wait();
      int64_t kept = 0;
      for (int64_t i = 0; i < count; ++i) {
        int64_t want = 0;
        for (int r = 0; r < n; ++r) want += test::encode(r, i);
        const bool sent = x[i] != 0.0f;
        kept += sent ? 1 : 0;
        if (sent) {
          ASSERT_EQ(x[i], static_cast<float>(want)) << "index " << i;
        }
        // What was not sent waits in the residual.
        ASSERT_EQ(feedback.residual()[i], sent ? 0.0f : static_cast<float>(test::encode(me, i)))
            << "index " << i;
      }
      EXPECT_EQ(kept, kernels::kept_elements(count, o.codec)) << "step " << step;
    }
  }
}

// The bytes counted per peer: the ring's, for the k values (f32) and the
// selection's hash (two i64), one round each; what rank i counts as sent to
// j, j counts as received from i; and the transport moved no less, plus at
// most its own headers.
TEST(SparseAllreduce, RandomKCountsItsBytesPerPeer) {
  auto comm = test::world();
  const int n = comm->size(), me = comm->rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int64_t count = 100003;
  std::vector<float> x(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) x[i] = static_cast<float>(test::encode(me, i));
  RelaxedStats stats;
  SparseAllreduceOptions o;
  o.codec = random_k(kernels::RandomKMode::rolling, 5, 3);
  o.stats = &stats;
  comm->barrier()->wait();
  const CommStats before = comm->stats();
  sparse_allreduce(*comm, TensorView::host(x.data(), count), ExecContext::host(), o)->wait();
  const CommStats after = comm->stats();
  const RelaxedCounts c = stats.counts();
  EXPECT_EQ(c.rounds, 2u);
  const int64_t k = kernels::kept_elements(count, o.codec);
  // Every rank sends 2 (n - 1) / n of each tensor: all of it twice but its
  // own chunk and its right neighbour's (chunk j: numel / n, one more for
  // the first numel % n).
  const auto ring = [&](int64_t numel, int64_t element) {
    const auto chunk = [&](int j) { return numel / n + (j < numel % n ? 1 : 0); };
    return static_cast<uint64_t>((2 * numel - chunk(me) - chunk((me + 1) % n)) * element);
  };
  EXPECT_EQ(c.bytes_sent, ring(k, 4) + ring(2, 8));
  EXPECT_EQ(test::counts_that_disagree(*comm, c), "");
  const uint64_t moved = after.bytes_sent - before.bytes_sent;
  EXPECT_LE(c.bytes_sent, moved);
  EXPECT_LE(moved, c.bytes_sent + 4096 * 4);  // headers of the two rings' few messages
}

// Ranks that draw different selections never sum unrelated coordinates:
// PeerMismatch on every rank, x untouched.
TEST(SparseAllreduce, SelectionsThatDifferFailEveryRank) {
  const int n = test::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  auto comm = create_mpi_communicator();
  const int me = comm->rank();
  std::vector<float> x(1000, 1.0f);
  kernels::ErrorFeedback feedback(1000);
  for (size_t i = 0; i < 1000; ++i) feedback.residual()[i] = 0.25f * static_cast<float>(i % 5);
  const std::vector<float> residual = feedback.residual();
  SparseAllreduceOptions o;
  o.codec = random_k(kernels::RandomKMode::stratified, me == n - 1 ? 2 : 1, 0);
  o.feedback = &feedback;
  WorkPtr w = sparse_allreduce(*comm, TensorView::host(x.data(), 1000), ExecContext::host(), o);
  EXPECT_THROW(w->wait(), PeerMismatch);
  for (float v : x) ASSERT_EQ(v, 1.0f);
  // The failed call left the error feedback as it was.
  EXPECT_EQ(std::memcmp(feedback.residual().data(), residual.data(), 1000 * sizeof(float)), 0);
  o.feedback = nullptr;
  std::vector<double> d(8);
  EXPECT_THROW(sparse_allreduce(*comm, TensorView::host(d.data(), 8), ExecContext::host(), o),
               InvalidArgument);
  o.codec.kind = CompressorKind::minmax;
  EXPECT_THROW(sparse_allreduce(*comm, TensorView::host(x.data(), 1000), ExecContext::host(), o),
               InvalidArgument);
  o.codec = random_k(kernels::RandomKMode::stratified, 1, 0);
  kernels::ErrorFeedback wrong(999);
  o.feedback = &wrong;
  EXPECT_THROW(sparse_allreduce(*comm, TensorView::host(x.data(), 1000), ExecContext::host(), o),
               InvalidArgument);
}

// ---- top-k --------------------------------------------------------------------

CompressorConfig top_k(double ratio, bool approximate = true) {
  CompressorConfig c;
  c.kind = CompressorKind::topk;
  c.ratio = ratio;
  c.approximate = approximate;
  return c;
}

// The library's layout, written out here: the shards are n balanced parts
// of m (the first m % n one larger).
std::vector<int64_t> balanced(int64_t m, int n) {
  std::vector<int64_t> v(static_cast<size_t>(n), m / n);
  for (int64_t j = 0; j < m % n; ++j) ++v[static_cast<size_t>(j)];
  return v;
}
// Shard j's share of k: floor(k / n), plus 1 where (j - step) mod m < k mod
// n among the m shards larger than floor(k / n) (the first m).
std::vector<int64_t> shares(int64_t k, const std::vector<int64_t>& shard, uint64_t step) {
  const auto n = static_cast<int64_t>(shard.size());
  std::vector<int64_t> v(shard.size(), k / n);
  const auto m = std::count_if(shard.begin(), shard.end(), [&](int64_t c) { return c > k / n; });
  for (int64_t j = 0; j < m; ++j)
    if ((j + m - static_cast<int64_t>(step % static_cast<uint64_t>(m))) % m < k % n) ++v[j];
  return v;
}
std::vector<int64_t> starts(const std::vector<int64_t>& counts) {
  std::vector<int64_t> s(counts.size(), 0);
  for (size_t j = 1; j < counts.size(); ++j) s[j] = s[j - 1] + counts[j - 1];
  return s;
}

// Positions of the `k` largest |v[begin, begin + count)|, ties to the lower
// index (the exact selection's order).
std::vector<int64_t> largest(const std::vector<float>& v, int64_t begin, int64_t count, int64_t k) {
  std::vector<int64_t> idx(static_cast<size_t>(count));
  std::iota(idx.begin(), idx.end(), begin);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int64_t a, int64_t b) { return std::fabs(v[a]) > std::fabs(v[b]); });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

WorkPtr run(Communicator& comm, std::vector<float>& x, const SparseAllreduceOptions& o) {
  return sparse_allreduce(comm, TensorView::host(x.data(), static_cast<int64_t>(x.size())),
                          ExecContext::host(), o);
}

// Rank r's nonzeros sit at i % 200 == 7 r, with values that encode (rank,
// index) and alternate in sign; each shard's share of k covers the union of
// the ranks' nonzeros, so nothing is dropped: x is the exact sum (or the
// sum divided as f32 divides it), 0 elsewhere, and the residuals stay 0.
TEST(TopK, ExactWhenEverythingFits) {
  auto comm = test::world();
  const int n = comm->size(), me = comm->rank();
  const int64_t count = 10007;
  const auto value = [](int r, int64_t i) -> float {
    if (i % 200 != 7 * r) return 0.0f;
    const float v = static_cast<float>(test::encode(r, i));
    return (i / 200) % 2 ? -v : v;
  };
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    for (bool approximate : {true, false}) {
      for (bool feedback : {false, true}) {
        std::vector<float> x(static_cast<size_t>(count));
        for (int64_t i = 0; i < count; ++i) x[i] = value(me, i);
        kernels::ErrorFeedback worker(count);
        kernels::ErrorFeedback server(sparse_allreduce_owned(count, me, n));
        SparseAllreduceOptions o;
        o.codec = top_k(0.05, approximate);
        o.op = op;
        if (feedback) {
          o.feedback = &worker;
          o.server_feedback = &server;
        }
        run(*comm, x, o)->wait();
        for (int64_t i = 0; i < count; ++i) {
          float want = 0;
          for (int r = 0; r < n; ++r) want += value(r, i);
          if (op == ReduceOp::avg) want /= static_cast<float>(n);
          ASSERT_EQ(x[i], want) << "index " << i << " op " << op << " approximate " << approximate;
        }
        for (float e : worker.residual()) ASSERT_EQ(e, 0.0f);
        for (float e : server.residual()) ASSERT_EQ(e, 0.0f);
      }
    }
  }
}

// Tensors smaller than the rank count, and empty ones: shards without
// elements and shares of k that are 0.
TEST(TopK, TinyTensors) {
  auto comm = test::world();
  const int n = comm->size(), me = comm->rank();
  for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{5}}) {
    for (double ratio : {1.0, 0.5}) {
      std::vector<float> x(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) x[i] = static_cast<float>(test::encode(me, i));
      kernels::ErrorFeedback worker(count);
      SparseAllreduceOptions o;
      o.codec = top_k(ratio);
      o.feedback = &worker;
      run(*comm, x, o)->wait();
      const std::vector<int64_t> shard = balanced(count, n);
      const std::vector<int64_t> kept = shares(kernels::kept_elements(count, o.codec), shard, 0);
      int64_t nonzero = 0;
      for (int64_t i = 0; i < count; ++i) {
        int64_t want = 0;
        for (int r = 0; r < n; ++r) want += test::encode(r, i);
        if (x[i] != 0.0f) {
          ++nonzero;
          ASSERT_EQ(x[i], static_cast<float>(want)) << "count " << count << " index " << i;
        }
        // Every rank's values are positive and ordered alike: what was not
        // sent is x's own value.
        ASSERT_EQ(worker.residual()[i],
                  x[i] != 0.0f ? 0.0f : static_cast<float>(test::encode(me, i)));
      }
      EXPECT_EQ(nonzero, std::accumulate(kept.begin(), kept.end(), int64_t{0}));
      if (ratio == 1.0) {
        EXPECT_EQ(nonzero, count);
      }
      for (int j = 0; j < n; ++j) EXPECT_LE(kept[j], shard[j]) << "shard " << j;
    }
  }
}

// Dense integers of distinct magnitudes, placed differently on every rank:
// each rank sends the top k_j of each shard, the owner keeps the top k_j of
// their sum. Checked against that selection computed here, exactly, with the
// residuals holding what each step dropped; and over several calls nothing
// is lost: outputs + worker residuals + server residuals = calls x the sum.
TEST(TopK, KeepsEachShardsLargestAndLosesNothing) {
  auto comm = test::world();
  const int n = comm->size(), me = comm->rank();
  const int64_t count = 4099;  // prime: i -> (i + 13 r) 7919 mod count is a permutation
  const auto input = [&](int r) {
    std::vector<float> v(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      const auto m = static_cast<float>(((i + 13 * r) * 7919) % count + 1);
      v[i] = (i + r) % 3 == 0 ? -m : m;
    }
    return v;
  };
  const CompressorConfig codec = top_k(0.03, /*approximate=*/false);
  const std::vector<int64_t> shard = balanced(count, n), first = starts(shard);
  const std::vector<int64_t> kept = shares(kernels::kept_elements(count, codec), shard, 0);

  // The expected result of one call, from every rank's input.
  std::vector<float> acc(static_cast<size_t>(count), 0.0f), want(acc.size(), 0.0f);
  std::vector<float> want_worker = input(me), want_server(static_cast<size_t>(shard[me]), 0.0f);
  for (int r = 0; r < n; ++r) {
    const std::vector<float> v = input(r);
    for (int j = 0; j < n; ++j)
      for (int64_t i : largest(v, first[j], shard[j], kept[j])) {
        acc[i] += v[i];
        if (r == me) want_worker[i] = 0.0f;
      }
  }
  for (int j = 0; j < n; ++j)
    for (int64_t i : largest(acc, first[j], shard[j], kept[j])) want[i] = acc[i];
  for (int64_t i = 0; i < shard[me]; ++i) want_server[i] = acc[first[me] + i] - want[first[me] + i];

  kernels::ErrorFeedback worker(count), server(sparse_allreduce_owned(count, me, n));
  SparseAllreduceOptions o;
  o.codec = codec;
  o.feedback = &worker;
  o.server_feedback = &server;
  std::vector<float> x = input(me);
  run(*comm, x, o)->wait();
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_EQ(x[i], want[i]) << "index " << i;
    ASSERT_EQ(worker.residual()[i], want_worker[i]) << "index " << i;
  }
  for (int64_t i = 0; i < shard[me]; ++i) ASSERT_EQ(server.residual()[i], want_server[i]);

  // Two more calls; then this rank's share of the balance, summed over the
  // ranks (integers: exact in f32).
  std::vector<float> total = x;
  for (int call = 0; call < 2; ++call) {
    x = input(me);
    run(*comm, x, o)->wait();
    for (int64_t i = 0; i < count; ++i) total[i] += x[i];
  }
  std::vector<float> balance(static_cast<size_t>(count), 0.0f);
  for (int64_t i = 0; i < count; ++i)
    balance[i] = (me == 0 ? total[i] : 0.0f) + worker.residual()[i];
  for (int64_t i = 0; i < shard[me]; ++i) balance[first[me] + i] += server.residual()[i];
  comm->allreduce(TensorView::host(balance.data(), count), ExecContext::host())->wait();
  std::vector<float> sum(static_cast<size_t>(count), 0.0f);
  for (int r = 0; r < n; ++r) {
    const std::vector<float> v = input(r);
    for (int64_t i = 0; i < count; ++i) sum[i] += v[i];
  }
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(balance[i], 3.0f * sum[i]) << "index " << i;
}

// Random floats, averaged: every rank holds the same bits, with at most k
// nonzeros.
TEST(TopK, BitwiseIdenticalOnEveryRank) {
  auto comm = test::world();
  const int me = comm->rank();
  const int64_t count = 100003;
  std::mt19937 rng(1234u + static_cast<unsigned>(me));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(count));
  for (float& v : x) v = normal(rng);
  kernels::ErrorFeedback worker(count);
  SparseAllreduceOptions o;
  o.codec = top_k(0.01);
  o.op = ReduceOp::avg;
  o.feedback = &worker;
  for (int call = 0; call < 2; ++call) {
    std::vector<float> y = x;
    run(*comm, y, o)->wait();
    EXPECT_EQ(test::rank_that_differs(*comm, y), -1) << "call " << call;
    EXPECT_LE(std::count_if(y.begin(), y.end(), [](float v) { return v != 0.0f; }),
              kernels::kept_elements(count, o.codec));
  }
}

// Unequal shares (shards split by weight, empty ones included; k split in
// proportion; the owners' slots sent straight to every rank): with
// everything kept the exact sum, as with equal shares; with 1% kept, at
// most k nonzeros, identical on every rank, the server residual sized by
// sparse_allreduce_owned with the same shares, and bytes per peer that
// agree between the two ends. A rank whose shares differ fails every rank.
TEST(TopK, UnequalShares) {
  auto comm = test::world();
  const int n = comm->size(), me = comm->rank();
  for (const std::vector<double>& shares : test::unequal_shares(n)) {
    const std::string split = ::testing::PrintToString(shares);
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{5}, int64_t{10007}}) {
      std::vector<float> x(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) x[i] = static_cast<float>(test::encode(me, i));
      SparseAllreduceOptions o;
      o.codec = top_k(1.0);
      o.shares = shares;
      run(*comm, x, o)->wait();
      for (int64_t i = 0; i < count; ++i) {
        int64_t want = 0;
        for (int r = 0; r < n; ++r) want += test::encode(r, i);
        ASSERT_EQ(x[i], static_cast<float>(want))
            << "shares " << split << " count " << count << " index " << i;
      }
    }
    const int64_t count = 100003;
    std::mt19937 rng(99u + static_cast<unsigned>(me));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(count));
    for (float& v : x) v = normal(rng);
    kernels::ErrorFeedback worker(count), server(sparse_allreduce_owned(count, me, n, shares));
    RelaxedStats stats;
    SparseAllreduceOptions o;
    o.codec = top_k(0.01);
    o.op = ReduceOp::avg;
    o.feedback = &worker;
    o.server_feedback = &server;
    o.stats = &stats;
    o.shares = shares;
    run(*comm, x, o)->wait();
    EXPECT_EQ(test::rank_that_differs(*comm, x), -1) << "shares " << split;
    EXPECT_LE(std::count_if(x.begin(), x.end(), [](float v) { return v != 0.0f; }),
              kernels::kept_elements(count, o.codec))
        << "shares " << split;
    EXPECT_EQ(test::counts_that_disagree(*comm, stats.counts()), "") << "shares " << split;
  }
  if (n < 2) return;
  std::vector<float> x(4096, 1.0f);
  SparseAllreduceOptions o;
  o.codec = top_k(0.1);
  o.shares.assign(static_cast<size_t>(n), 1.0);
  if (me == n - 1) o.shares[0] = 3.0;
  EXPECT_THROW(run(*comm, x, o)->wait(20s), Error);
  for (float v : x) ASSERT_EQ(v, 1.0f);
}

// A tensor with k < n: the shards whose share of k is 0 take turns as the
// step rolls, so over the calls every element is sent and the residuals
// stay bounded (a shard that never gets a share would keep all it ever
// received). Every rank's input is the same, in [1, 2).
TEST(TopK, SharesOfKRotateWithTheStep) {
  auto comm = test::world();
  const int n = comm->size();
  const int64_t count = 6;
  kernels::ErrorFeedback worker(count);
  SparseAllreduceOptions o;
  o.codec = top_k(0.1);  // k = 1
  o.feedback = &worker;
  ASSERT_EQ(kernels::kept_elements(count, o.codec), 1);
  const auto input = [](int64_t i) { return 1.0f + static_cast<float>(i) / 6.0f; };
  std::vector<int> sent(static_cast<size_t>(count), 0);
  const int calls = 30;
  for (int call = 0; call < calls; ++call) {
    o.codec.step = static_cast<uint64_t>(call);
    std::vector<float> x(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) x[i] = input(i);
    run(*comm, x, o)->wait();
    for (int64_t i = 0; i < count; ++i) sent[i] += x[i] != 0.0f;
  }
  // Each of the m nonempty shards gets k = 1 once in m calls, and each of
  // its c elements, whose inputs differ by less than 2x, is the largest of
  // the shard's residual within 2 c of its turns.
  const std::vector<int64_t> shard = balanced(count, n);
  const auto m = std::count_if(shard.begin(), shard.end(), [](int64_t c) { return c > 0; });
  const float bound = 2.0f * static_cast<float>(shard[0] * m) * input(count - 1);
  for (int64_t i = 0; i < count; ++i) {
    EXPECT_GT(sent[i], 0) << "element " << i << " never sent in " << calls << " calls";
    EXPECT_LE(worker.residual()[i], bound) << "element " << i;
  }
}

// The bytes each rank sends, from the transport's own counters: the
// RelaxedStats figure plus one transport header per edge (the alltoallv's
// n - 1 peers, the ring's neighbours), and at most 16 k in all, a bound that
// does not depend on n (the blocks carry (n - 1) / n of the 8-byte pairs
// twice; headers of about 300 bytes per peer stay below 16 k / n here). At
// 1% density that is far below a tenth of the f32 ring's bytes.
TEST(TopK, BytesPerRankDoNotGrowWithRanks) {
  auto comm = test::world();
  const int n = comm->size(), me = comm->rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int64_t count = 200000;
  std::vector<float> x(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) x[i] = static_cast<float>(test::encode(me, i));
  RelaxedStats stats;
  SparseAllreduceOptions o;
  o.codec = top_k(0.01);
  o.stats = &stats;
  comm->barrier()->wait();
  const CommStats before = comm->stats();
  run(*comm, x, o)->wait();
  const CommStats after = comm->stats();
  const uint64_t transport = after.bytes_sent - before.bytes_sent;
  const int64_t k = kernels::kept_elements(count, o.codec);
  const RelaxedCounts c = stats.counts();
  EXPECT_EQ(c.rounds, 1u);
  const uint64_t edges = static_cast<uint64_t>(n - 1) + (n == 2 ? 1 : 2);
  EXPECT_GT(transport, c.bytes_sent);
  EXPECT_LE(transport, c.bytes_sent + 128 * edges) << edges << " edges";
  EXPECT_LE(transport, static_cast<uint64_t>(16 * k));
  const double f32_ring = 2.0 * (n - 1) / n * static_cast<double>(count) * 4;
  EXPECT_LE(static_cast<double>(transport), 0.1 * f32_ring);
}

TEST(TopK, BadInputIsRejected) {
  auto comm = test::world();
  const int n = comm->size(), me = comm->rank();
  std::vector<float> x(64, 1.0f);
  std::vector<double> d(64, 1.0);
  const ExecContext& host = ExecContext::host();
  const auto rejects = [&](const SparseAllreduceOptions& o, const TensorView& t, const char* what) {
    try {
      sparse_allreduce(*comm, t, host, o);
      ADD_FAILURE() << what << ": accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(e.message().find("sparse_allreduce"), std::string::npos) << e.what();
    }
  };
  const TensorView xv = TensorView::host(x.data(), 64);
  SparseAllreduceOptions o;
  o.codec = top_k(0.1);
  rejects(o, TensorView::host(d.data(), 64), "f64 tensor");
  for (double ratio : {0.0, -0.5, 1.5, static_cast<double>(NAN)}) {
    o.codec.ratio = ratio;
    rejects(o, xv, "ratio out of (0, 1]");
  }
  o.codec = top_k(0.1);
  o.op = ReduceOp::max;
  rejects(o, xv, "op max");
  o.op = ReduceOp::sum;
  kernels::ErrorFeedback wrong(65), wrong_server(sparse_allreduce_owned(64, me, n) + 1);
  o.feedback = &wrong;
  rejects(o, xv, "worker feedback of another size");
  o.feedback = nullptr;
  o.server_feedback = &wrong_server;
  rejects(o, xv, "server feedback of another size");
  o.codec = random_k(kernels::RandomKMode::stratified, 1, 0);
  rejects(o, xv, "server feedback with randomk");
  // Nothing was submitted: the communicator is still in step.
  o = {};
  o.codec = top_k(0.1);
  run(*comm, x, o)->wait();
}

// Corrupts what rank `bad` sends once the stage before it completed: its
// alltoallv block for its right neighbour, or its all-gather slot. `corrupt`
// gets the payload (after the block's 16-byte prefix or the slot's 16-byte
// status word).
class CorruptingCommunicator final : public ForwardingCommunicator {
 public:
  enum class Where { alltoallv, allgatherv };
  using Corrupt = std::function<void(unsigned char* payload, int64_t bytes)>;
  CorruptingCommunicator(CommunicatorPtr inner, int bad, Corrupt corrupt,
                         Where where = Where::alltoallv)
      : ForwardingCommunicator(std::move(inner)),
        bad_(bad),
        corrupt_(std::move(corrupt)),
        where_(where) {}

  WorkPtr allgatherv(const TensorView& input, const TensorView& output,
                     const std::vector<int64_t>& counts, const ExecContext& ctx,
                     const AllgatherOptions& options) override {
    AllgatherOptions o = options;
    if (where_ == Where::allgatherv && rank() == bad_)
      o.after = corrupting(o.after, static_cast<unsigned char*>(input.data) + 16, input.numel - 16);
    return inner_->allgatherv(input, output, counts, ctx, o);
  }
  WorkPtr alltoallv(const TensorView& input, const std::vector<int64_t>& send_counts,
                    const TensorView& output, const std::vector<int64_t>& recv_counts,
                    const ExecContext& ctx, const AlltoallOptions& options) override {
    AlltoallOptions o = options;
    if (where_ == Where::alltoallv && rank() == bad_) {
      const int to = (rank() + 1) % size();
      int64_t offset = 0;
      for (int p = 0; p < to; ++p) offset += send_counts[p];
      o.after = corrupting(o.after, static_cast<unsigned char*>(input.data) + offset + 16,
                           send_counts[to] - 16);
    }
    return inner_->alltoallv(input, send_counts, output, recv_counts, ctx, o);
  }

 private:
  WorkPtr corrupting(const WorkPtr& after, unsigned char* payload, int64_t bytes) {
    const WorkPtr before = after ? after : when_all({}, nullptr, "now");
    return before->then(
        [corrupt = corrupt_, payload, bytes](const Work& done) {
          if (!done.exception()) corrupt(payload, bytes);
        },
        "corrupting");
  }

  int bad_;
  Corrupt corrupt_;
  Where where_;
};

// A top-k payload: the 48-byte header (kind at byte 6, n at byte 16, k at
// byte 24), k u32 indices, k f32 values.
int64_t field(const unsigned char* payload, int offset) {
  int64_t v;
  std::memcpy(&v, payload + offset, sizeof v);
  return v;
}
void set_field(unsigned char* payload, int offset, int64_t v) {
  std::memcpy(payload + offset, &v, sizeof v);
}
void set_nan_value(unsigned char* payload, int64_t) {
  const float nan = NAN;
  std::memcpy(payload + 48 + field(payload, 24) * 4, &nan, 4);
}

// What a call threw: its type (the most derived of relaxcc's) and message.
struct Outcome {
  std::string type = "nothing", message;
};
Outcome outcome_of(const WorkPtr& w) {
  Outcome o;
  try {
    w->wait(20s);
  } catch (const PeerMismatch& e) {
    o = {"PeerMismatch", e.message()};
  } catch (const CorruptPayload& e) {
    o = {"CorruptPayload", e.message()};
  } catch (const InvalidArgument& e) {
    o = {"InvalidArgument", e.message()};
  } catch (const CommunicationError& e) {
    o = {"CommunicationError", e.message()};
  } catch (const std::exception& e) {
    o = {"other", e.what()};
  }
  return o;
}

// Worker and server error feedback holding residuals from an earlier call
// (made on `comm`), and the bits to compare them with after a failed one.
struct Feedback {
  kernels::ErrorFeedback worker, server;
  std::vector<float> worker_before, server_before;
  Feedback(Communicator& comm, int64_t count)
      : worker(count), server(sparse_allreduce_owned(count, comm.rank(), comm.size())) {
    std::vector<float> x(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) x[i] = static_cast<float>(test::encode(comm.rank(), i));
    SparseAllreduceOptions o;
    o.codec = top_k(0.05);
    o.feedback = &worker;
    o.server_feedback = &server;
    run(comm, x, o)->wait();
    worker_before = worker.residual();
    server_before = server.residual();
  }
  void use(SparseAllreduceOptions& o) {
    o.feedback = &worker;
    o.server_feedback = &server;
  }
  bool unchanged() const {
    return std::memcmp(worker.residual().data(), worker_before.data(),
                       worker_before.size() * sizeof(float)) == 0 &&
           std::memcmp(server.residual().data(), server_before.data(),
                       server_before.size() * sizeof(float)) == 0;
  }
};

// One rank's payload for its neighbour's shard corrupted on the wire: an
// index past the shard, indices out of order, a NaN value, a count that
// does not fit the payload, a header for another shard size. Every rank
// throws CorruptPayload naming the sender; x and every residual stay as
// they were, bit for bit.
TEST(TopK, CorruptPayloadsFailEveryRank) {
  const int n = test::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::vector<std::pair<const char*, CorruptingCommunicator::Corrupt>> variants = {
      {"index past the shard",
       [](unsigned char* b, int64_t) {
         const auto past = static_cast<uint32_t>(field(b, 16));  // the shard's size
         const int64_t k = field(b, 24);
         std::memcpy(b + 48 + (k - 1) * 4, &past, 4);
       }},
      {"indices out of order",
       [](unsigned char* b, int64_t) {
         uint32_t first, second;
         std::memcpy(&first, b + 48, 4);
         std::memcpy(&second, b + 52, 4);
         std::memcpy(b + 48, &second, 4);
         std::memcpy(b + 52, &first, 4);
       }},
      {"NaN value", set_nan_value},
      {"k that does not fit",
       [](unsigned char* b, int64_t) { set_field(b, 24, field(b, 24) + 1); }},
      {"another shard size", [](unsigned char* b, int64_t) { set_field(b, 16, field(b, 16) + 1); }},
  };
  const int64_t count = 4096;
  for (const auto& [name, corrupt] : variants) {
    CommunicatorPtr inner = create_mpi_communicator();
    Feedback feedback(*inner, count);
    auto comm = std::make_shared<CorruptingCommunicator>(inner, n - 1, corrupt);
    std::vector<float> x(count);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(test::encode(comm->rank(), i));
    const std::vector<float> before = x;
    SparseAllreduceOptions o;
    o.codec = top_k(0.05);
    feedback.use(o);
    const Outcome got = outcome_of(run(*comm, x, o));
    EXPECT_EQ(got.type, "CorruptPayload") << name << ": " << got.message;
    EXPECT_NE(got.message.find(detail::concat("rank ", n - 1)), std::string::npos) << got.message;
    EXPECT_EQ(x, before) << name;
    EXPECT_TRUE(feedback.unchanged()) << name;
  }
}

// An owner's slot whose payload is corrupted into a valid header of another
// kind (randomk of 2k values: the same size) before the all-gather: every
// rank checks the kind, count and k of every slot before it writes x, and
// throws CorruptPayload with x untouched.
TEST(TopK, GatheredPayloadOfAnotherKindFailsEveryRank) {
  const int n = test::world_size();
  auto comm = std::make_shared<CorruptingCommunicator>(
      create_mpi_communicator(), n - 1,
      [](unsigned char* b, int64_t) {
        b[6] = static_cast<unsigned char>(CompressorKind::randomk);
        set_field(b, 24, 2 * field(b, 24));
      },
      CorruptingCommunicator::Where::allgatherv);
  std::vector<float> x(4096);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(test::encode(comm->rank(), i));
  const std::vector<float> before = x;
  SparseAllreduceOptions o;
  o.codec = top_k(0.05);
  const Outcome got = outcome_of(run(*comm, x, o));
  EXPECT_EQ(got.type, "CorruptPayload") << got.message;
  EXPECT_NE(got.message.find("randomk"), std::string::npos) << got.message;
  EXPECT_EQ(x, before);
}

// Ranks that disagree (on the ratio, the op, the element count) or a bad
// value on one rank (NaN, x plus its residual overflowing in the last
// shard, a sum that overflows): the same type on every rank, naming the
// rank at fault, with x and every residual untouched, bit for bit.
TEST(TopK, DisagreementAndBadValuesFailEveryRank) {
  const int n = test::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  struct Variant {
    const char* name;
    const char* type;
    bool names_last_rank;
  };
  const std::vector<Variant> variants = {
      {"ratio", "PeerMismatch", false},
      {"op", "PeerMismatch", true},
      {"element count", "PeerMismatch", true},
      {"NaN", "InvalidArgument", true},
      {"x plus residual overflows", "InvalidArgument", true},
      {"sum overflows", "InvalidArgument", false},
  };
  for (size_t v = 0; v < variants.size(); ++v) {
    const Variant& variant = variants[v];
    auto comm = create_mpi_communicator();
    const int me = comm->rank();
    const bool last = me == n - 1;
    Feedback feedback(*comm, 4096);
    std::vector<float> x(4096, 1.0f);
    SparseAllreduceOptions o;
    o.codec = top_k(0.05);
    feedback.use(o);
    switch (v) {
      case 0:
        if (last) o.codec.ratio = 0.1;
        break;
      case 1:
        if (last) o.op = ReduceOp::avg;
        break;
      case 2:
        // Same shares of k and payload sizes, other shards: only the
        // fingerprint tells. Without feedback (sized for 4096).
        o.codec.keep = 10;
        o.feedback = nullptr;
        o.server_feedback = nullptr;
        if (last) x.push_back(1.0f);
        break;
      case 3:
        if (last) x[100] = NAN;
        break;
      case 4:
        if (last) {
          x.back() = 3e38f;
          feedback.worker.residual().back() = 3e38f;
          feedback.worker_before = feedback.worker.residual();
        }
        break;
      default:
        o.codec.ratio = 1.0;
        x[100] = 3e38f;
    }
    const std::vector<float> before = x;
    const Outcome got = outcome_of(run(*comm, x, o));
    EXPECT_EQ(got.type, variant.type) << variant.name << ": " << got.message;
    if (variant.names_last_rank) {
      EXPECT_NE(got.message.find(detail::concat("rank ", n - 1)), std::string::npos)
          << variant.name << ": " << got.message;
    }
    if (v == 3 && last) {
      EXPECT_NE(got.message.find("nan"), std::string::npos) << got.message;
    }
    EXPECT_EQ(std::memcmp(x.data(), before.data(), x.size() * sizeof(float)), 0) << variant.name;
    EXPECT_TRUE(feedback.unchanged()) << variant.name;
  }
}

// Two owners that fail differently (shard 0's sum overflows, rank 0's
// payload for shard 1 is corrupt): every rank throws the first failing
// owner's error, owner 0's InvalidArgument, the owners included.
TEST(TopK, TheFirstFailingOwnerDecidesOnEveryRank) {
  const int n = test::world_size();
  if (n < 3) GTEST_SKIP() << "needs 3 ranks";
  auto comm = std::make_shared<CorruptingCommunicator>(create_mpi_communicator(), 0, set_nan_value);
  std::vector<float> x(300, 1.0f);
  x[0] = 3e38f;
  SparseAllreduceOptions o;
  o.codec = top_k(1.0);
  const Outcome got = outcome_of(run(*comm, x, o));
  EXPECT_EQ(got.type, "InvalidArgument") << got.message;
  EXPECT_NE(got.message.find("shard 0"), std::string::npos) << got.message;
}

}  // namespace
}  // namespace relaxcc
