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
#include "relaxcc/mpi_communicator.h"
#include "relaxcc/relaxed/sparse_allreduce.h"
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

// Ranks that draw different selections never sum unrelated coordinates:
// PeerMismatch on every rank, x untouched.
TEST(SparseAllreduce, SelectionsThatDifferFailEveryRank) {
  const int n = test::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  auto comm = create_mpi_communicator();
  const int me = comm->rank();
  std::vector<float> x(1000, 1.0f);
  SparseAllreduceOptions o;
  o.codec = random_k(kernels::RandomKMode::stratified, me == n - 1 ? 2 : 1, 0);
  WorkPtr w = sparse_allreduce(*comm, TensorView::host(x.data(), 1000), ExecContext::host(), o);
  EXPECT_THROW(w->wait(), PeerMismatch);
  for (float v : x) ASSERT_EQ(v, 1.0f);
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

// The library's layout, written out here: n balanced parts of m (the first
// m % n one larger), for the shards and for the shares of k.
std::vector<int64_t> balanced(int64_t m, int n) {
  std::vector<int64_t> v(static_cast<size_t>(n), m / n);
  for (int64_t j = 0; j < m % n; ++j) ++v[static_cast<size_t>(j)];
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
      const std::vector<int64_t> kept = balanced(kernels::kept_elements(count, o.codec), n);
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
      EXPECT_LE(kept[0], shard[0]);
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
  const std::vector<int64_t> kept = balanced(kernels::kept_elements(count, codec), n);

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

// The first rank whose x differs from this rank's in any bit; -1: none.
int rank_that_differs(Communicator& comm, const std::vector<float>& x) {
  const auto count = static_cast<int64_t>(x.size());
  const int n = comm.size();
  std::vector<float> mine = x, all(static_cast<size_t>(count * n));
  comm.allgather(TensorView::host(mine.data(), count), TensorView::host(all.data(), count * n),
                 ExecContext::host())
      ->wait();
  for (int r = 0; r < n; ++r)
    if (std::memcmp(all.data() + r * count, x.data(), x.size() * sizeof(float)) != 0) return r;
  return -1;
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
    EXPECT_EQ(rank_that_differs(*comm, y), -1) << "call " << call;
    EXPECT_LE(std::count_if(y.begin(), y.end(), [](float v) { return v != 0.0f; }),
              kernels::kept_elements(count, o.codec));
  }
}

// The bytes each rank sends, as RelaxedStats counts them: k_j pairs of 8
// bytes and a 48-byte header to each other owner, the owners' slots (an
// 8-byte status, then the payload) but the right neighbour's in the ring.
// At 1% density that is far below a tenth of the f32 ring's bytes, and at
// most 16 k plus headers whatever the rank count.
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
  run(*comm, x, o)->wait();
  const int64_t k = kernels::kept_elements(count, o.codec);
  const std::vector<int64_t> kept = balanced(k, n);
  uint64_t want = 0;
  for (int j = 0; j < n; ++j) {
    const uint64_t payload = kept[j] > 0 ? 48 + 8 * static_cast<uint64_t>(kept[j]) : 0;
    if (j != me) want += payload;
    if (j != (me + 1) % n) want += 8 + payload;
  }
  const RelaxedCounts c = stats.counts();
  EXPECT_EQ(c.rounds, 1u);
  EXPECT_EQ(c.bytes_sent, want);
  const double f32_ring = 2.0 * (n - 1) / n * static_cast<double>(count) * 4;
  EXPECT_LE(static_cast<double>(c.bytes_sent), 0.1 * f32_ring);
  EXPECT_LE(c.bytes_sent, static_cast<uint64_t>(16 * k + 104 * (n - 1)));
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

// Sends a corrupted alltoallv block: `corrupt` edits rank `bad`'s block for
// its right neighbour once the encoding (the call's `after`) completed.
class CorruptingCommunicator : public Communicator {
 public:
  using Corrupt = std::function<void(unsigned char* block, int64_t bytes)>;
  CorruptingCommunicator(CommunicatorPtr inner, int bad, Corrupt corrupt)
      : inner_(std::move(inner)), bad_(bad), corrupt_(std::move(corrupt)) {}
  using Communicator::allreduce;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  bool poisoned() const override { return inner_->poisoned(); }
  CommStats stats() const override { return inner_->stats(); }
  int max_p2p_tag() const override { return inner_->max_p2p_tag(); }
  std::shared_ptr<Communicator> group(const std::vector<int>& members,
                                      const GroupOptions& options) override {
    return inner_->group(members, options);
  }
  std::shared_ptr<Communicator> split(int color, int key, const SplitOptions& options) override {
    return inner_->split(color, key, options);
  }
  std::shared_ptr<Communicator> split_node_local(const SplitOptions& options) override {
    return inner_->split_node_local(options);
  }
  TensorView allocate(int64_t numel, DType dtype) override {
    return inner_->allocate(numel, dtype);
  }
  WorkPtr point_to_point(const std::vector<P2POp>& ops, const ExecContext& ctx,
                         const P2POptions& options) override {
    return inner_->point_to_point(ops, ctx, options);
  }
  WorkPtr allreduce(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                    const AllreduceOptions& options) override {
    return inner_->allreduce(input, output, ctx, options);
  }
  WorkPtr reduce_scatter(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                         const ReduceScatterOptions& options) override {
    return inner_->reduce_scatter(input, output, ctx, options);
  }
  WorkPtr allgather(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                    const AllgatherOptions& options) override {
    return inner_->allgather(input, output, ctx, options);
  }
  WorkPtr allgatherv(const TensorView& input, const TensorView& output,
                     const std::vector<int64_t>& counts, const ExecContext& ctx,
                     const AllgatherOptions& options) override {
    return inner_->allgatherv(input, output, counts, ctx, options);
  }
  WorkPtr broadcast(const TensorView& data, const ExecContext& ctx,
                    const BroadcastOptions& options) override {
    return inner_->broadcast(data, ctx, options);
  }
  WorkPtr alltoall(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                   const AlltoallOptions& options) override {
    return inner_->alltoall(input, output, ctx, options);
  }
  WorkPtr alltoallv(const TensorView& input, const std::vector<int64_t>& send_counts,
                    const TensorView& output, const std::vector<int64_t>& recv_counts,
                    const ExecContext& ctx, const AlltoallOptions& options) override {
    AlltoallOptions o = options;
    if (rank() == bad_) {
      const int to = (rank() + 1) % size();
      int64_t offset = 0;
      for (int p = 0; p < to; ++p) offset += send_counts[p];
      unsigned char* block = static_cast<unsigned char*>(input.data) + offset;
      const int64_t bytes = send_counts[to];
      const WorkPtr before = o.after ? o.after : when_all({}, nullptr, "now");
      o.after = before->then(
          [corrupt = corrupt_, block, bytes](const Work& done) {
            if (!done.exception()) corrupt(block, bytes);
          },
          "corrupting");
    }
    return inner_->alltoallv(input, send_counts, output, recv_counts, ctx, o);
  }
  WorkPtr barrier(const BarrierOptions& options) override { return inner_->barrier(options); }
  WorkPtr compute(std::function<void()> fn, const OpOptions& options) override {
    return inner_->compute(std::move(fn), options);
  }

 private:
  CommunicatorPtr inner_;
  int bad_;
  Corrupt corrupt_;
};

// A top-k payload: the 48-byte header (n at byte 16, k at byte 24), k u32
// indices, k f32 values.
int64_t field(const unsigned char* block, int offset) {
  int64_t v;
  std::memcpy(&v, block + offset, sizeof v);
  return v;
}
void set_field(unsigned char* block, int offset, int64_t v) {
  std::memcpy(block + offset, &v, sizeof v);
}

// One rank's payload for its neighbour's shard corrupted on the wire: an
// index past the shard, indices out of order, a NaN value, a count that
// does not fit the payload, a header for another shard size. Every rank
// throws CorruptPayload, and x stays as it was.
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
      {"NaN value",
       [](unsigned char* b, int64_t) {
         const float nan = NAN;
         std::memcpy(b + 48 + field(b, 24) * 4, &nan, 4);
       }},
      {"k that does not fit",
       [](unsigned char* b, int64_t) { set_field(b, 24, field(b, 24) + 1); }},
      {"another shard size", [](unsigned char* b, int64_t) { set_field(b, 16, field(b, 16) + 1); }},
  };
  for (const auto& [name, corrupt] : variants) {
    auto comm = std::make_shared<CorruptingCommunicator>(create_mpi_communicator(), n - 1, corrupt);
    std::vector<float> x(4096);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(test::encode(comm->rank(), i));
    const std::vector<float> before = x;
    SparseAllreduceOptions o;
    o.codec = top_k(0.05);
    WorkPtr w = run(*comm, x, o);
    EXPECT_THROW(w->wait(20s), CorruptPayload) << name;
    EXPECT_EQ(x, before) << name;
  }
}

// Ranks that disagree on the ratio (the layout of the payloads): PeerMismatch
// on every rank. One rank's NaN: an error on every rank. A sum that
// overflows f32: InvalidArgument on every rank.
TEST(TopK, DisagreementAndBadValuesFailEveryRank) {
  const int n = test::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  for (int variant = 0; variant < 3; ++variant) {
    auto comm = create_mpi_communicator();
    const int me = comm->rank();
    std::vector<float> x(4096, 1.0f);
    SparseAllreduceOptions o;
    o.codec = top_k(0.05);
    if (variant == 0 && me == n - 1) o.codec.ratio = 0.1;
    if (variant == 1 && me == n - 1) x[100] = NAN;
    if (variant == 2) {
      o.codec.ratio = 1.0;
      x[100] = 3e38f;
    }
    WorkPtr w = run(*comm, x, o);
    if (variant == 0) {
      EXPECT_THROW(w->wait(20s), PeerMismatch);
    } else if (variant == 1) {
      EXPECT_THROW(w->wait(20s), Error);
    } else {
      EXPECT_THROW(w->wait(20s), InvalidArgument);
    }
  }
}

}  // namespace
}  // namespace relaxcc
