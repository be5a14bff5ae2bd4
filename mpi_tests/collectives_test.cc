// relaxcc's collectives over MPI: every collective x dtype x op x count,
// checked exactly on data that encodes rank and index.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <regex>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "relaxcc/collectives/shares.h"
#include "relaxcc/errors.h"
#include "relaxcc/mpi_communicator.h"
#include "src/collectives/ring_schedule.h"
#include "test_util.h"

namespace relaxcc {
namespace {

using test::Buffer;
using test::world;

// 1001 and 4099 elements move in several eager parts per step under
// recursive doubling (4004 to 32792 bytes), the last part shorter.
const int64_t kCounts[] = {0, 1, 1001, 4099, (1 << 19) + 3};

template <typename Fn>
void for_each_dtype(DType t, Fn&& fn) {
  visit_dtype(t, [&](auto tag) { fn(tag); });
}

// Counts the elements of `b` that differ from want(i).
template <typename T, typename Want>
int64_t count_wrong(Buffer& b, Want want) {
  int64_t wrong = 0;
  for (int64_t i = 0; i < b.numel; ++i) wrong += same_element(b.as<T>()[i], want(i)) ? 0 : 1;
  return wrong;
}

class AllreduceTest : public ::testing::TestWithParam<AllreduceAlgo> {};

TEST_P(AllreduceTest, EveryDtypeOpAndCountIsExact) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  for (DType t : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      for (int64_t count : kCounts) {
        Buffer b(t, count);
        test::fill(b, r);
        AllreduceOptions o;
        o.op = op;
        o.algo = GetParam();
        comm->allreduce(b.view(), ExecContext::host(), o)->wait();
        for_each_dtype(t, [&](auto tag) {
          using T = decltype(tag);
          const int64_t wrong =
              count_wrong<T>(b, [&](int64_t i) { return test::expected_reduction<T>(i, op, n); });
          ASSERT_EQ(wrong, 0) << "dtype " << t << " op " << op << " count " << count << " algo "
                              << allreduce_algo_name(GetParam());
        });
      }
    }
  }
}

// Out of place: the output gets the reduction, the input stays as it was.
TEST_P(AllreduceTest, OutOfPlaceLeavesTheInput) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  for (DType t : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      for (int64_t count : kCounts) {
        Buffer in(t, count), out(t, count), want_in(t, count);
        test::fill(in, r);
        test::fill(want_in, r);
        AllreduceOptions o;
        o.op = op;
        o.algo = GetParam();
        comm->allreduce(in.view(), out.view(), ExecContext::host(), o)->wait();
        for_each_dtype(t, [&](auto tag) {
          using T = decltype(tag);
          const int64_t wrong =
              count_wrong<T>(out, [&](int64_t i) { return test::expected_reduction<T>(i, op, n); });
          const int64_t changed = count_wrong<T>(in, [&](int64_t i) { return want_in.as<T>()[i]; });
          ASSERT_EQ(wrong, 0) << "dtype " << t << " op " << op << " count " << count << " algo "
                              << allreduce_algo_name(GetParam());
          ASSERT_EQ(changed, 0) << "input changed: dtype " << t << " op " << op << " count "
                                << count;
        });
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Algos, AllreduceTest,
                         ::testing::Values(AllreduceAlgo::ring, AllreduceAlgo::recursive_doubling,
                                           AllreduceAlgo::automatic),
                         [](const auto& p) { return std::string(allreduce_algo_name(p.param)); });

// Shares from link rates (relaxcc/collectives/shares.h): the owner
// schedule gives a host too slow to carry its own data nothing, the ring
// keeps equal chunks where no split beats them, and equal rates give equal
// shares.
TEST(Shares, FromLinkRates) {
  const auto near = [](const std::vector<double>& got, const std::vector<double>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t j = 0; j < want.size(); ++j) EXPECT_NEAR(got[j], want[j], 1e-9) << "rank " << j;
  };
  near(owner_shares({1000, 1000, 200, 200}), {0.5, 0.5, 0, 0});
  near(owner_shares({100, 100, 100}), {1.0 / 3, 1.0 / 3, 1.0 / 3});
  near(owner_shares({1000, 200}), {0.5, 0.5});
  near(ring_shares({1000, 1000, 200, 200}), {0.25, 0.25, 0.25, 0.25});
  near(ring_shares({7, 7, 7}), {1.0 / 3, 1.0 / 3, 1.0 / 3});
  // One slow host: its chunk takes both of its links to N (1.5x the ring).
  const std::vector<double> rates{1000, 1000, 1000, 200}, f = ring_shares(rates);
  double slowest = 0;
  for (int j = 0; j < 4; ++j)
    slowest = std::max(
        slowest, (2 - f[j] - f[(j + 1) % 4]) / (std::min(rates[j], rates[(j + 1) % 4]) / 1000));
  EXPECT_NEAR(slowest, 5.0, 0.05);  // equal chunks: 7.5
  EXPECT_THROW(owner_shares({1000, 0}), InvalidArgument);
  EXPECT_THROW(shard_counts(10, 2, {1, -1}), InvalidArgument);
  EXPECT_THROW(shard_counts(10, 2, {0, 0}), InvalidArgument);
  EXPECT_THROW(shard_counts(10, 3, {1, 1}), InvalidArgument);
  EXPECT_EQ(shard_counts(10, 4, {}), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(shard_counts(10, 4, {0.5, 0.5, 0, 0}), (std::vector<int64_t>{5, 5, 0, 0}));
  EXPECT_EQ(shard_counts(7, 3, {1, 1, 1}), (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(shard_counts(0, 2, {1, 3}), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(shard_counts(5, 2, {0, 1}), (std::vector<int64_t>{0, 5}));
}

// The ring with unequal chunks, empty ones included, gives exactly what
// equal chunks give: every dtype and op, exact on data that encodes rank
// and index.
TEST(Shares, UnequalRingChunksAreExact) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  if (n == 1) GTEST_SKIP() << "needs 2 or more ranks";
  for (const std::vector<double>& shares : test::unequal_shares(n)) {
    for (DType t : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{4099}, int64_t{70001}}) {
          Buffer b(t, count);
          test::fill(b, r);
          AllreduceOptions o;
          o.op = op;
          o.shares = shares;
          comm->allreduce(b.view(), ExecContext::host(), o)->wait();
          for_each_dtype(t, [&](auto tag) {
            using T = decltype(tag);
            const int64_t wrong =
                count_wrong<T>(b, [&](int64_t i) { return test::expected_reduction<T>(i, op, n); });
            ASSERT_EQ(wrong, 0) << "dtype " << t << " op " << op << " count " << count << " shares "
                                << shares[0] << "," << shares[1];
          });
        }
      }
    }
  }
}

// Ranks that pass different shares fail with PeerMismatch instead of mixing
// chunks, and the communicator stays usable.
TEST(Shares, DifferentSharesFailOnEveryRank) {
  using namespace std::chrono_literals;
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  if (n == 1) GTEST_SKIP() << "needs 2 or more ranks";
  Buffer b(DType::i32, 4096);
  test::fill(b, r);
  AllreduceOptions o;
  o.shares.assign(static_cast<size_t>(n), 1.0);
  if (r == 0) o.shares[0] = 3.0;
  EXPECT_THROW(comm->allreduce(b.view(), ExecContext::host(), o)->wait(10s), PeerMismatch);
  o.shares[0] = 1.0;
  test::fill(b, r);
  comm->allreduce(b.view(), ExecContext::host(), o)->wait(10s);
  EXPECT_EQ(b.as<int32_t>()[4095], test::expected_reduction<int32_t>(4095, ReduceOp::sum, n));
}

// Buffers from Communicator::allocate: on one node the ring reads the left
// neighbour's buffer in place (shared mode). The view starts at an odd
// offset inside its allocation, as a bucket inside a larger arena does.
TEST(SharedBuffers, AllreduceEveryDtypeOpAndCountIsExact) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  for (AllreduceAlgo algo : {AllreduceAlgo::ring, AllreduceAlgo::automatic}) {
    for (DType t : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        for (int64_t count : kCounts) {
          const TensorView arena = comm->allocate(count + 3, t);
          const TensorView view = arena.slice(3, count);
          Buffer b(t, count);
          test::fill(b, r);
          if (count > 0) std::memcpy(view.data, b.bytes().data(), view.nbytes());
          AllreduceOptions o;
          o.op = op;
          o.algo = algo;
          comm->allreduce(view, ExecContext::host(), o)->wait();
          if (count > 0) std::memcpy(b.bytes().data(), view.data, view.nbytes());
          for_each_dtype(t, [&](auto tag) {
            using T = decltype(tag);
            const int64_t wrong =
                count_wrong<T>(b, [&](int64_t i) { return test::expected_reduction<T>(i, op, n); });
            ASSERT_EQ(wrong, 0) << "dtype " << t << " op " << op << " count " << count << " algo "
                                << allreduce_algo_name(algo);
          });
        }
      }
    }
  }
}

// Out of place into a shared output (the input in ordinary memory): the
// ring runs in shared mode with its partial sums in the output, and the
// input stays as it was.
TEST(SharedBuffers, AllreduceOutOfPlaceIntoSharedOutput) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  for (DType t : kAllDTypes) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      for (int64_t count : kCounts) {
        const TensorView out = comm->allocate(count, t);
        Buffer in(t, count), want_in(t, count), got(t, count);
        test::fill(in, r);
        test::fill(want_in, r);
        AllreduceOptions o;
        o.op = op;
        o.algo = AllreduceAlgo::ring;
        comm->allreduce(in.view(), out, ExecContext::host(), o)->wait();
        if (count > 0) std::memcpy(got.bytes().data(), out.data, out.nbytes());
        for_each_dtype(t, [&](auto tag) {
          using T = decltype(tag);
          const int64_t wrong =
              count_wrong<T>(got, [&](int64_t i) { return test::expected_reduction<T>(i, op, n); });
          const int64_t changed = count_wrong<T>(in, [&](int64_t i) { return want_in.as<T>()[i]; });
          ASSERT_EQ(wrong, 0) << "dtype " << t << " op " << op << " count " << count;
          ASSERT_EQ(changed, 0) << "input changed: dtype " << t << " op " << op << " count "
                                << count;
        });
      }
    }
  }
}

TEST(SharedBuffers, AllocateIsZeroedAndOwned) {
  auto comm = world();
  TensorView v = comm->allocate(1000, DType::i32);
  ASSERT_NE(v.owner, nullptr);
  for (int64_t i = 0; i < v.numel; ++i) ASSERT_EQ(static_cast<int32_t*>(v.data)[i], 0) << i;
  EXPECT_EQ(comm->allocate(0, DType::f32).numel, 0);
  EXPECT_THROW(comm->allocate(-1, DType::f32), InvalidArgument);
}

// host_scratch(): zeroed host memory that a released view gives back to a
// pool shared with the communicator's groups, so the next request of its
// size reuses it instead of faulting fresh pages in.
TEST(HostScratch, ZeroedAndReusedByTheCommunicatorAndItsGroups) {
  auto comm = world();
  // A size no other test of this program asks for.
  constexpr int64_t kBytes = (int64_t{5} << 20) + 3;
  TensorView a = comm->host_scratch(kBytes);
  ASSERT_NE(a.owner, nullptr);
  ASSERT_EQ(a.numel, kBytes);
  ASSERT_EQ(a.dtype, DType::u8);
  auto* bytes = static_cast<unsigned char*>(a.data);
  EXPECT_EQ(std::count(bytes, bytes + kBytes, 0), kBytes);
  std::memset(bytes, 0xab, static_cast<size_t>(kBytes));
  const void* first = a.data;
  a = TensorView();
  TensorView b = comm->host_scratch(kBytes);
  EXPECT_EQ(b.data, first);
  bytes = static_cast<unsigned char*>(b.data);
  EXPECT_EQ(std::count(bytes, bytes + kBytes, 0), kBytes);
  b = TensorView();
  std::vector<int> everyone(static_cast<size_t>(comm->size()));
  std::iota(everyone.begin(), everyone.end(), 0);
  GroupOptions key;
  key.key = 4242;
  const CommunicatorPtr group = comm->group(everyone, key);
  EXPECT_EQ(group->host_scratch(kBytes).data, first);
  EXPECT_EQ(comm->host_scratch(0).numel, 0);
  EXPECT_THROW(comm->host_scratch(-1), InvalidArgument);
}

// Many shared-buffer allreduces in flight on slices of one arena (a Reducer's
// buckets), with a large low-priority one throttled by high-priority ones.
TEST(SharedBuffers, ConcurrentSlicesOfOneArenaWithPriorities) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  const int64_t big_count = int64_t{1} << 20, small_bytes = 50016 * 8;
  const TensorView arena = comm->allocate(big_count * 4 + 8 * small_bytes, DType::u8);
  auto place = [&](Buffer& b, int64_t byte_offset) {
    TensorView v(static_cast<unsigned char*>(arena.data) + byte_offset, b.numel, b.dtype,
                 Device::host(), arena.owner);
    std::memcpy(v.data, b.bytes().data(), v.nbytes());
    return v;
  };
  Buffer big(DType::f32, big_count);
  test::fill(big, r);
  const TensorView big_view = place(big, 0);
  AllreduceOptions low;
  low.priority = -1;
  WorkPtr big_work = comm->allreduce(big_view, ExecContext::host(), low);
  std::vector<Buffer> small;
  std::vector<TensorView> views;
  std::vector<WorkPtr> works;
  for (int k = 0; k < 8; ++k) {
    small.emplace_back(DType::i64, 50000 + k);
    test::fill(small.back(), r, k);
    views.push_back(place(small.back(), big_count * 4 + k * small_bytes));
  }
  AllreduceOptions high;
  high.priority = 10;
  for (const TensorView& v : views) works.push_back(comm->allreduce(v, ExecContext::host(), high));
  for (auto& w : works) w->wait();
  big_work->wait();
  for (int k = 0; k < 8; ++k) {
    std::memcpy(small[k].bytes().data(), views[k].data, views[k].nbytes());
    ASSERT_EQ(
        count_wrong<int64_t>(
            small[k],
            [&](int64_t i) { return test::expected_reduction<int64_t>(i + k, ReduceOp::sum, n); }),
        0)
        << "bucket " << k;
  }
  std::memcpy(big.bytes().data(), big_view.data, big_view.nbytes());
  ASSERT_EQ(
      count_wrong<float>(
          big, [&](int64_t i) { return test::expected_reduction<float>(i, ReduceOp::sum, n); }),
      0);
}

// Two communicators of one process name their shared objects in one
// namespace: buffers of each, alive at once, stay distinct on every rank.
TEST(SharedBuffers, TwoCommunicatorsOfOneProcess) {
  auto comm = world();
  const CommunicatorPtr comms[2] = {comm, comm->split(0, comm->rank())};
  const int n = comm->size(), r = comm->rank();
  const int64_t count = (int64_t{1} << 18) + 5;
  for (int round = 0; round < 3; ++round) {
    TensorView views[2];
    for (int k = 0; k < 2; ++k) {
      views[k] = comms[k]->allocate(count, DType::i32);
      Buffer b(DType::i32, count);
      test::fill(b, r, round * 2 + k);
      std::memcpy(views[k].data, b.bytes().data(), views[k].nbytes());
    }
    for (int k = 0; k < 2; ++k) {
      AllreduceOptions o;
      o.algo = AllreduceAlgo::ring;
      comms[k]->allreduce(views[k], ExecContext::host(), o)->wait();
      Buffer b(DType::i32, count);
      std::memcpy(b.bytes().data(), views[k].data, views[k].nbytes());
      const int64_t offset = round * 2 + k;
      ASSERT_EQ(count_wrong<int32_t>(b,
                                     [&](int64_t i) {
                                       return test::expected_reduction<int32_t>(i + offset,
                                                                                ReduceOp::sum, n);
                                     }),
                0)
          << "round " << round << " communicator " << k;
    }
  }
}

// Inputs in ordinary memory, and in node-shared memory from allocate (at an
// odd offset inside the allocation), where the ring reads its neighbour's
// input and partial sums in place.
class ReduceScatterTest : public ::testing::TestWithParam<bool> {};

TEST_P(ReduceScatterTest, EveryDtypeOpAndCountIsExact) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  for (DType t : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{777}, int64_t{1 << 17}}) {
        Buffer in(t, count * n), out(t, count);
        test::fill(in, r);
        TensorView input = in.view();
        if (GetParam()) {
          input = comm->allocate(in.numel + 3, t).slice(3, in.numel);
          if (in.numel > 0) std::memcpy(input.data, in.bytes().data(), input.nbytes());
        }
        ReduceScatterOptions o;
        o.op = op;
        comm->reduce_scatter(input, out.view(), ExecContext::host(), o)->wait();
        for_each_dtype(t, [&](auto tag) {
          using T = decltype(tag);
          const int64_t wrong = count_wrong<T>(
              out, [&](int64_t i) { return test::expected_reduction<T>(r * count + i, op, n); });
          ASSERT_EQ(wrong, 0) << "dtype " << t << " op " << op << " count " << count;
        });
        // The input is left as it was.
        if (in.numel > 0) std::memcpy(in.bytes().data(), input.data, input.nbytes());
        for_each_dtype(t, [&](auto tag) {
          using T = decltype(tag);
          ASSERT_EQ(
              count_wrong<T>(in, [&](int64_t i) { return from_double<T>(test::encode(r, i)); }), 0);
        });
      }
    }
  }
}

// Several reduce-scatters in flight on shared inputs: each takes its own
// scratch for partial sums from the pool, and reuses released ones.
TEST(SharedBuffers, ConcurrentReduceScatters) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  const int64_t count = 50000;
  for (int round = 0; round < 2; ++round) {
    std::vector<TensorView> inputs;
    std::vector<Buffer> outputs;
    std::vector<WorkPtr> works;
    for (int k = 0; k < 4; ++k) {
      Buffer in(DType::i64, count * n);
      test::fill(in, r, k);
      inputs.push_back(comm->allocate(in.numel, DType::i64));
      std::memcpy(inputs.back().data, in.bytes().data(), inputs.back().nbytes());
      outputs.emplace_back(DType::i64, count);
    }
    for (int k = 0; k < 4; ++k) {
      ReduceScatterOptions o;
      o.priority = k % 2;
      works.push_back(comm->reduce_scatter(inputs[k], outputs[k].view(), ExecContext::host(), o));
    }
    for (auto& w : works) w->wait();
    for (int k = 0; k < 4; ++k) {
      ASSERT_EQ(count_wrong<int64_t>(outputs[k],
                                     [&](int64_t i) {
                                       return test::expected_reduction<int64_t>(r * count + i + k,
                                                                                ReduceOp::sum, n);
                                     }),
                0)
          << "round " << round << " reduce-scatter " << k;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Inputs, ReduceScatterTest, ::testing::Values(false, true),
                         [](const auto& p) {
                           return std::string(p.param ? "Shared" : "Ordinary");
                         });

// Outputs in ordinary memory, and in node-shared memory from allocate (at an
// odd offset inside the allocation), where the ring reads its neighbour's
// output in place.
class AllgatherTest : public ::testing::TestWithParam<bool> {
 protected:
  // Runs `gather` into an output of `out`'s size and copies the result to `out`.
  template <typename Gather>
  void gather_into(Communicator& comm, Buffer& out, Gather&& gather) {
    TensorView view = out.view();
    if (GetParam()) view = comm.allocate(out.numel + 3, out.dtype).slice(3, out.numel);
    gather(view)->wait();
    if (GetParam() && out.numel > 0) std::memcpy(out.bytes().data(), view.data, view.nbytes());
  }
};

TEST_P(AllgatherTest, EqualAndVariableCounts) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  for (DType t : kAllDTypes) {
    for (int64_t count : kCounts) {
      Buffer in(t, count), out(t, count * n);
      test::fill(in, r, r * count);
      gather_into(*comm, out, [&](const TensorView& o) {
        return comm->allgather(in.view(), o, ExecContext::host());
      });
      for_each_dtype(t, [&](auto tag) {
        using T = decltype(tag);
        ASSERT_EQ(count_wrong<T>(out,
                                 [&](int64_t i) {
                                   return from_double<T>(test::encode(
                                       static_cast<int>(i / std::max<int64_t>(count, 1)), i));
                                 }),
                  0)
            << "dtype " << t << " count " << count;
      });
    }
    // allgatherv: rank p contributes p * 100000 + 1 elements (rank 1 none when n > 2).
    std::vector<int64_t> counts(n);
    for (int p = 0; p < n; ++p) counts[p] = (n > 2 && p == 1) ? 0 : p * 100000 + 1;
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    std::vector<int64_t> offsets(n, 0);
    for (int p = 1; p < n; ++p) offsets[p] = offsets[p - 1] + counts[p - 1];
    Buffer in(t, counts[r]), out(t, total);
    test::fill(in, r, offsets[r]);
    gather_into(*comm, out, [&](const TensorView& o) {
      return comm->allgatherv(in.view(), o, counts, ExecContext::host());
    });
    for_each_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      ASSERT_EQ(count_wrong<T>(out,
                               [&](int64_t i) {
                                 const int owner =
                                     static_cast<int>(
                                         std::upper_bound(offsets.begin(), offsets.end(), i) -
                                         offsets.begin()) -
                                     1;
                                 int p = owner;
                                 while (counts[p] == 0 || i >= offsets[p] + counts[p]) --p;
                                 return from_double<T>(test::encode(p, i));
                               }),
                0)
          << "allgatherv dtype " << t;
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Outputs, AllgatherTest, ::testing::Values(false, true), [](const auto& p) {
  return std::string(p.param ? "Shared" : "Ordinary");
});

TEST(Broadcast, FromEveryRoot) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  for (DType t : kAllDTypes) {
    for (int64_t count : kCounts) {
      for (int root = 0; root < n; ++root) {
        Buffer b(t, count);
        test::fill(b, r);
        BroadcastOptions o;
        o.root = root;
        comm->broadcast(b.view(), ExecContext::host(), o)->wait();
        for_each_dtype(t, [&](auto tag) {
          using T = decltype(tag);
          ASSERT_EQ(
              count_wrong<T>(b, [&](int64_t i) { return from_double<T>(test::encode(root, i)); }),
              0);
        });
      }
    }
  }
}

TEST(Alltoall, EqualAndVariableBlocks) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  for (DType t : kAllDTypes) {
    const int64_t block = 333;
    Buffer in(t, block * n), out(t, block * n);
    test::fill(in, r);  // block p holds encode(r, p * block + j)
    comm->alltoall(in.view(), out.view(), ExecContext::host())->wait();
    for_each_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      // Block p of the output came from rank p's block r.
      ASSERT_EQ(count_wrong<T>(out,
                               [&](int64_t i) {
                                 return from_double<T>(test::encode(static_cast<int>(i / block),
                                                                    r * block + i % block));
                               }),
                0)
          << t;
    });
  }
  // alltoallv: rank r sends (r + p + 1) elements to rank p.
  std::vector<int64_t> send(n), recv(n);
  for (int p = 0; p < n; ++p) {
    send[p] = r + p + 1;
    recv[p] = p + r + 1;
  }
  const int64_t s_total = std::accumulate(send.begin(), send.end(), int64_t{0});
  const int64_t r_total = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  Buffer in(DType::i64, s_total), out(DType::i64, r_total);
  int64_t k = 0;
  for (int p = 0; p < n; ++p)
    for (int64_t j = 0; j < send[p]; ++j) in.as<int64_t>()[k++] = r * 1000000 + p * 1000 + j;
  comm->alltoallv(in.view(), send, out.view(), recv, ExecContext::host())->wait();
  k = 0;
  for (int p = 0; p < n; ++p)
    for (int64_t j = 0; j < recv[p]; ++j)
      ASSERT_EQ(out.as<int64_t>()[k++], p * 1000000 + r * 1000 + j);
}

// Across nodes (each rank its own node here) blocks and ring segments go in
// messages of at most RELAXCC_NET_SEGMENT_BYTES: many small ones, exact.
TEST(Alltoall, BlocksAcrossNodesGoInParts) {
  MpiCommunicatorOptions o;
  o.tunables.ranks_per_node = 1;
  o.tunables.net_segment_bytes = 1000;
  auto comm = test::create_communicator(o.tunables);
  const int n = comm->size(), r = comm->rank();
  // Rank r sends 997 (r + p + 1) i64 elements to rank p: 8 to 32 parts.
  std::vector<int64_t> send(n), recv(n);
  for (int p = 0; p < n; ++p) {
    send[p] = 997 * (r + p + 1);
    recv[p] = 997 * (p + r + 1);
  }
  const int64_t s_total = std::accumulate(send.begin(), send.end(), int64_t{0});
  const int64_t r_total = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  Buffer in(DType::i64, s_total), out(DType::i64, r_total);
  int64_t k = 0;
  for (int p = 0; p < n; ++p)
    for (int64_t j = 0; j < send[p]; ++j)
      in.as<int64_t>()[k++] = int64_t{r} * 1000000000 + p * 100000 + j;
  comm->alltoallv(in.view(), send, out.view(), recv, ExecContext::host())->wait();
  k = 0;
  for (int p = 0; p < n; ++p)
    for (int64_t j = 0; j < recv[p]; ++j)
      ASSERT_EQ(out.as<int64_t>()[k++], int64_t{p} * 1000000000 + r * 100000 + j)
          << "from rank " << p;
  Buffer b(DType::i32, 100003);
  test::fill(b, r);
  AllreduceOptions ring;
  ring.algo = AllreduceAlgo::ring;
  comm->allreduce(b.view(), ExecContext::host(), ring)->wait();
  for (int64_t i = 0; i < b.numel; ++i)
    ASSERT_EQ(b.as<int32_t>()[i], test::expected_reduction<int32_t>(i, ReduceOp::sum, n)) << i;
}

// The in-flight window sized to a path: the bandwidth-delay product in
// segments, rounded up, within [min_depth, max(min_depth, max_bytes / segment)].
TEST(Window, FromRateAndRoundTrip) {
  constexpr int64_t kSeg = 128 * 1024, kMost = int64_t{64} << 20;
  // 1 Gbit/s over 100 ms: 12.5 MB, 95.4 segments.
  EXPECT_EQ(path_window(1e9, 0.1, kSeg, 4, kMost), 96);
  // Exactly 8 segments per round trip.
  EXPECT_EQ(path_window(8.0 * 8 * kSeg, 1.0, kSeg, 4, kMost), 8);
  // 10 Gbit/s over 100 us: one segment; the floor.
  EXPECT_EQ(path_window(1e10, 1e-4, kSeg, 4, kMost), 4);
  // 10 Gbit/s over 100 ms wants 954 segments; 64 MiB holds 512.
  EXPECT_EQ(path_window(1e10, 0.1, kSeg, 4, kMost), 512);
  EXPECT_EQ(path_window(std::numeric_limits<double>::infinity(), 0.1, kSeg, 4, kMost), 512);
  // A bound below the floor keeps the floor.
  EXPECT_EQ(path_window(1e10, 0.1, kSeg, 4, kSeg), 4);
  // Nothing measured.
  EXPECT_EQ(path_window(1e9, 0.0, kSeg, 4, kMost), 4);
  EXPECT_EQ(path_window(0.0, 0.1, kSeg, 4, kMost), 4);
  EXPECT_EQ(path_window(1e9, std::numeric_limits<double>::quiet_NaN(), kSeg, 4, kMost), 4);
}

// Across nodes (each rank its own node here) the window is sized to the
// round trip measured at creation: at a rate this high it reaches the
// RELAXCC_WINDOW_BYTES bound, 256 segments of 1 KB, so every segment of a
// step is in flight at once. The ring collectives and the broadcast chain
// stay exact; a group keeps its parent's figures; an explicit
// RELAXCC_PIPELINE_DEPTH wins.
TEST(Window, SizedToThePathAndExact) {
  if (test::world_size() == 1) GTEST_SKIP() << "needs 2 or more ranks";
  Tunables t = Tunables::from_env();
  t.ranks_per_node = 1;
  t.net_segment_bytes = 1024;
  t.pipeline_depth = 0;
  t.link_mbit = int64_t{1} << 40;
  t.window_bytes = 256 * 1024;
  auto comm = test::create_communicator(t);
  const int n = comm->size(), r = comm->rank();
  const CommStats stats = comm->stats();
  EXPECT_GT(stats.round_trip_ns, 0);
  EXPECT_EQ(stats.pipeline_depth, 256);
  std::vector<int> everyone(n);
  std::iota(everyone.begin(), everyone.end(), 0);
  auto group = comm->group(everyone, {.key = 3});
  EXPECT_EQ(group->stats().round_trip_ns, stats.round_trip_ns);
  EXPECT_EQ(group->stats().pipeline_depth, 256);
  // The small count's chunks have fewer segments than the window (the last
  // reduce-scatter step takes one slot per segment), the large one's more
  // (391 to 782 segments of 1 KB: its slots are recycled).
  for (int64_t count : {int64_t{1001} * n, int64_t{100003} * n}) {
    Buffer b(DType::i32, count);
    test::fill(b, r);
    AllreduceOptions ring;
    ring.algo = AllreduceAlgo::ring;
    comm->allreduce(b.view(), ExecContext::host(), ring)->wait();
    for (int64_t i = 0; i < count; ++i)
      ASSERT_EQ(b.as<int32_t>()[i], test::expected_reduction<int32_t>(i, ReduceOp::sum, n))
          << "element " << i << " of " << count;
    Buffer all(DType::i64, count), mine(DType::i64, count / n);
    for (int64_t i = 0; i < count; ++i) all.as<int64_t>()[i] = int64_t{r} * 1000000000 + i;
    comm->reduce_scatter(all.view(), mine.view(), ExecContext::host())->wait();
    for (int64_t i = 0; i < count / n; ++i) {
      const int64_t k = r * (count / n) + i;
      ASSERT_EQ(mine.as<int64_t>()[i], int64_t{n} * (n - 1) / 2 * 1000000000 + n * k) << k;
    }
    for (int root = 0; root < n; ++root) {
      Buffer c(DType::i64, count);
      for (int64_t i = 0; i < count; ++i) c.as<int64_t>()[i] = int64_t{r} * 1000000000 + i;
      BroadcastOptions o;
      o.root = root;
      group->broadcast(c.view(), ExecContext::host(), o)->wait();
      for (int64_t i = 0; i < count; ++i)
        ASSERT_EQ(c.as<int64_t>()[i], int64_t{root} * 1000000000 + i) << "root " << root;
    }
  }
  t.pipeline_depth = 7;
  auto fixed = test::create_communicator(t);
  EXPECT_EQ(fixed->stats().round_trip_ns, 0);
  EXPECT_EQ(fixed->stats().pipeline_depth, 7);
}

TEST(PointToPoint, RingExchangeInOneBatch) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  if (n == 1) GTEST_SKIP() << "needs 2 or more ranks";
  const int right = (r + 1) % n, left = (r - 1 + n) % n;
  for (int64_t count : kCounts) {
    Buffer out(DType::i32, count), in(DType::i32, count);
    test::fill(out, r);
    comm->point_to_point({P2POp::send(right, out.view(), 5), P2POp::recv(left, in.view(), 5)},
                         ExecContext::host())
        ->wait();
    ASSERT_EQ(count_wrong<int32_t>(
                  in, [&](int64_t i) { return static_cast<int32_t>(test::encode(left, i)); }),
              0);
  }
}

TEST(Barrier, Completes) {
  auto comm = world();
  for (int i = 0; i < 5; ++i) comm->barrier()->wait();
}

// The small-operation path (Engine::run_now): every size recursive doubling
// moves, in turn on one communicator (so the kept operation is reused or
// replaced: one message, parts of 3.9 KiB, one message above 35 KiB), with
// one rank late by more than the inline polling budget now and then (its
// peers' operations then go on with Works of their own). Results exact;
// every call counted once.
TEST(SmallAllreduce, SizesInTurnAndLatePeersAreExact) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  const uint64_t before = comm->stats().operations;
  int calls = 0;
  for (int round = 0; round < 3; ++round) {
    for (int64_t count : {2, 1000, 1100, 5000, 9000, 20000, 2}) {
      Buffer b(DType::f32, count);
      test::fill(b, r);
      if (n > 1 && (round + count) % n == r) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      AllreduceOptions o;
      o.algo = AllreduceAlgo::recursive_doubling;
      comm->allreduce(b.view(), ExecContext::host(), o)->wait();
      ++calls;
      const int64_t wrong = count_wrong<float>(
          b, [&](int64_t i) { return test::expected_reduction<float>(i, ReduceOp::sum, n); });
      ASSERT_EQ(wrong, 0) << "count " << count << " round " << round;
    }
  }
  if (n > 1) {
    EXPECT_EQ(comm->stats().operations - before, static_cast<uint64_t>(calls));
  }
}

// Two threads, each on its own lane of one engine: one thread's small
// allreduce may run on its thread at once while the other's is queued, or
// find the engine busy and queue itself. Results exact on both lanes.
TEST(SmallAllreduce, TwoThreadsOnTwoLanesOfOneEngineAreExact) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  if (n == 1) GTEST_SKIP() << "a single rank completes at once";
  std::vector<int> everyone(static_cast<size_t>(n));
  std::iota(everyone.begin(), everyone.end(), 0);
  GroupOptions g;
  g.key = 7;
  CommunicatorPtr other = comm->group(everyone, g);
  int64_t wrong[2] = {0, 0};
  auto run = [&](const CommunicatorPtr& c, int salt, int64_t* out) {
    for (int k = 0; k < 300; ++k) {
      Buffer b(DType::f32, 1 + (k * 7 + salt) % 1500);
      test::fill(b, r, salt);
      c->allreduce(b.view(), ExecContext::host())->wait();
      *out += count_wrong<float>(b, [&](int64_t i) {
        return test::expected_reduction<float>(i + salt, ReduceOp::sum, n);
      });
    }
  };
  std::thread second([&] { run(other, 1000, &wrong[1]); });
  run(comm, 0, &wrong[0]);
  second.join();
  EXPECT_EQ(wrong[0], 0);
  EXPECT_EQ(wrong[1], 0);
}

// The direct exchange of two ranks (Engine::run_now, Operation::
// begin_direct) without a polling budget (spin_us 0): the exchange goes
// back to the protocol as soon as a poll finds nothing, mostly before the
// peer's header message arrived (direct_exchange_test forces the stage
// after it). Random delays mix ranks that exchange directly with ranks
// whose engine is still busy (their call is queued). One part (2 and 980
// elements), two (1024, 4 KiB), six (5000) and nine (8820); sums and maxima
// of i32 and averages of f32 exact, every call counted once, then a
// mismatch in the middle of a part fails both ranks and leaves the pair
// usable.
TEST(SmallAllreduce, DirectExchangeWithoutPollingBudgetIsExact) {
  using namespace std::chrono_literals;
  const int n = world()->size(), r = world()->rank();
  if (n < 2) GTEST_SKIP() << "the direct exchange needs two ranks";
  MpiCommunicatorOptions o;
  o.tunables = Tunables::from_env();
  o.tunables.spin_us = 0;
  CommunicatorPtr all = test::create_communicator(o.tunables);  // collective
  if (n % 2 == 1 && r == n - 1) GTEST_SKIP() << "the last of an odd number of ranks has no pair";
  GroupOptions g;
  g.key = 11;
  CommunicatorPtr pair = all->group({r - r % 2, r - r % 2 + 1}, g);
  const int pr = pair->rank();
  std::mt19937 delays(static_cast<unsigned>(r) + 1);
  const uint64_t before = pair->stats().operations;
  int calls = 0;
  AllreduceOptions rd;
  rd.algo = AllreduceAlgo::recursive_doubling;
  for (int round = 0; round < 40; ++round) {
    for (int64_t count : {2, 980, 1024, 5000, 8820}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
        Buffer b(DType::i32, count);
        test::fill(b, pr);
        if (delays() % 4 == 0)
          std::this_thread::sleep_for(std::chrono::microseconds(delays() % 300));
        rd.op = op;
        pair->allreduce(b.view(), ExecContext::host(), rd)->wait();
        ++calls;
        for (int64_t i = 0; i < count; ++i)
          ASSERT_EQ(b.as<int32_t>()[i], test::expected_reduction<int32_t>(i, op, 2))
              << "count " << count << " round " << round << " element " << i;
      }
      Buffer f(DType::f32, count);
      test::fill(f, pr);
      rd.op = ReduceOp::avg;
      pair->allreduce(f.view(), ExecContext::host(), rd)->wait();
      ++calls;
      const int64_t wrong = count_wrong<float>(
          f, [&](int64_t i) { return test::expected_reduction<float>(i, ReduceOp::avg, 2); });
      ASSERT_EQ(wrong, 0) << "count " << count << " round " << round;
    }
  }
  EXPECT_EQ(pair->stats().operations - before, static_cast<uint64_t>(calls));
  // Six parts against six parts of another last size: the headers disagree.
  Buffer bad(DType::i32, 5000 + (pr == 1 ? 7 : 0));
  rd.op = ReduceOp::sum;
  EXPECT_THROW(pair->allreduce(bad.view(), ExecContext::host(), rd)->wait(10s), PeerMismatch);
  Buffer good(DType::i32, 1024);
  test::fill(good, pr);
  pair->allreduce(good.view(), ExecContext::host(), rd)->wait(10s);
  EXPECT_EQ(good.as<int32_t>()[1023], test::expected_reduction<int32_t>(1023, ReduceOp::sum, 2));
}

TEST(Async, LargeAllreduceReturnsBeforeItCompletes) {
  auto comm = world();
  if (comm->size() == 1) GTEST_SKIP() << "a single rank completes at once";
  Buffer b(DType::f32, int64_t{16} << 20);  // 64 MiB
  test::fill(b, comm->rank());
  const auto t0 = std::chrono::steady_clock::now();
  WorkPtr work = comm->allreduce(b.view(), ExecContext::host());
  const auto t_call = std::chrono::steady_clock::now() - t0;
  const bool completed_at_return = work->is_completed();
  work->wait();
  const auto t_all = std::chrono::steady_clock::now() - t0;
  // The proof is the state at return; times only order the events (a loaded
  // CI machine can deschedule the caller for milliseconds).
  EXPECT_FALSE(completed_at_return);
  EXPECT_LT(t_call, t_all);
  EXPECT_EQ(work->exception(), nullptr);
  EXPECT_NE(work->description().find("allreduce #"), std::string::npos) << work->description();
}

TEST(Async, ConcurrentPrioritiesCompleteCorrectly) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  Buffer big(DType::f32, int64_t{4} << 20);
  test::fill(big, r);
  AllreduceOptions low;
  low.priority = -1;
  WorkPtr big_work = comm->allreduce(big.view(), ExecContext::host(), low);
  std::vector<Buffer> small;
  std::vector<WorkPtr> works;
  for (int k = 0; k < 8; ++k) {
    small.emplace_back(DType::i64, 50000 + k);
    test::fill(small.back(), r, k);
  }
  // A low-priority alltoall too: throttled to one send in flight while the
  // high-priority allreduces run.
  const int64_t block = int64_t{1} << 16;
  Buffer a2a_in(DType::i32, block * n), a2a_out(DType::i32, block * n);
  test::fill(a2a_in, r);
  AlltoallOptions low_a2a;
  low_a2a.priority = -1;
  WorkPtr a2a_work = comm->alltoall(a2a_in.view(), a2a_out.view(), ExecContext::host(), low_a2a);
  // And a low-priority point-to-point batch: 4 sends to each neighbour, from
  // which each rank receives as many.
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  std::vector<Buffer> p2p_out, p2p_in;
  std::vector<P2POp> p2p_ops;
  for (int k = 0; k < 4; ++k) {
    p2p_out.emplace_back(DType::i32, block);
    test::fill(p2p_out.back(), r, k);
    p2p_in.emplace_back(DType::i32, block);
  }
  for (int k = 0; k < 4; ++k) {
    p2p_ops.push_back(P2POp::send(right, p2p_out[k].view(), k));
    p2p_ops.push_back(P2POp::recv(left, p2p_in[k].view(), k));
  }
  P2POptions low_p2p;
  low_p2p.priority = -1;
  WorkPtr p2p_work = n > 1 ? comm->point_to_point(p2p_ops, ExecContext::host(), low_p2p) : nullptr;
  AllreduceOptions high;
  high.priority = 10;
  for (auto& s : small) works.push_back(comm->allreduce(s.view(), ExecContext::host(), high));
  for (auto& w : works) w->wait();
  big_work->wait();
  a2a_work->wait();
  if (p2p_work) {
    p2p_work->wait();
    for (int k = 0; k < 4; ++k)
      for (int64_t j = 0; j < block; ++j)
        ASSERT_EQ(p2p_in[k].as<int32_t>()[j], test::encode(left, j + k)) << "message " << k;
  }
  // Block p of the output is rank p's block r: encode(p, r * block + j).
  for (int p = 0; p < n; ++p)
    for (int64_t j = 0; j < block; ++j)
      ASSERT_EQ(a2a_out.as<int32_t>()[p * block + j], test::encode(p, r * block + j))
          << "from rank " << p << ", element " << j;
  for (int k = 0; k < 8; ++k)
    ASSERT_EQ(
        count_wrong<int64_t>(
            small[k],
            [&](int64_t i) { return test::expected_reduction<int64_t>(i + k, ReduceOp::sum, n); }),
        0);
  ASSERT_EQ(
      count_wrong<float>(
          big, [&](int64_t i) { return test::expected_reduction<float>(i, ReduceOp::sum, n); }),
      0);
}

// Two communicators of one process trace into two files, each a whole
// JSON array of well-formed events (they once shared one file and
// interleaved their writes).
// Stages submitted at once, each to run after the one before, on two
// communicators: each reads its input only once the stage before completed
// (recursive doubling's and allgather's local copies included).
TEST(After, StagesOnTwoCommunicatorsReadTheirInputInOrder) {
  auto comm = world();
  auto other = comm->split(0, comm->rank());
  const int n = comm->size(), r = comm->rank();
  for (int64_t count : {int64_t{1}, int64_t{1001}, int64_t{(1 << 16) + 3}}) {
    Buffer b(DType::i64, count), out(DType::i64, count), gathered(DType::i64, count * n);
    test::fill(b, r);
    WorkPtr first = comm->allreduce(b.view(), ExecContext::host());
    AllreduceOptions second_options;
    second_options.after = first;
    WorkPtr second = other->allreduce(b.view(), out.view(), ExecContext::host(), second_options);
    AllgatherOptions third_options;
    third_options.after = second;
    WorkPtr third =
        comm->allgather(out.view(), gathered.view(), ExecContext::host(), third_options);
    BroadcastOptions fourth_options;
    fourth_options.after = third;
    fourth_options.root = n - 1;
    WorkPtr fourth = other->broadcast(out.view(), ExecContext::host(), fourth_options);
    fourth->wait();
    EXPECT_TRUE(first->is_completed() && second->is_completed() && third->is_completed());
    for (int64_t i = 0; i < count; ++i) {
      const int64_t sum = test::expected_reduction<int64_t>(i, ReduceOp::sum, n);
      ASSERT_EQ(b.as<int64_t>()[i], sum) << "count " << count << " index " << i;
      ASSERT_EQ(out.as<int64_t>()[i], n * sum) << "count " << count << " index " << i;
      for (int p = 0; p < n; ++p) ASSERT_EQ(gathered.as<int64_t>()[p * count + i], n * sum);
    }
  }
}

// An operation submitted after a Work keeps its place in the order but starts
// only when the Work completes: later operations of the ring and recursive
// doubling go past it, and it reads the data written before the Work completed.
TEST(After, WaitsForItsDependencyWithoutHoldingUpLaterOperations) {
  using namespace std::chrono_literals;
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  for (int64_t count : {int64_t{0}, int64_t{7}, int64_t{(1 << 16) + 3}}) {
    auto gate = std::make_shared<Work>("gate");
    Buffer held(DType::i32, count), free(DType::i32, count);
    test::fill(free, r);
    AllreduceOptions o;
    o.after = gate;
    WorkPtr waiting = comm->allreduce(held.view(), ExecContext::host(), o);
    WorkPtr later = comm->allreduce(free.view(), ExecContext::host());
    later->wait();
    EXPECT_FALSE(waiting->wait_for(20ms)) << "count " << count;
    test::fill(held, r, 3);  // written after the call, before the gate opens
    gate->complete(nullptr);
    waiting->wait();
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_EQ(free.as<int32_t>()[i], test::expected_reduction<int32_t>(i, ReduceOp::sum, n));
      ASSERT_EQ(held.as<int32_t>()[i], test::expected_reduction<int32_t>(i + 3, ReduceOp::sum, n));
    }
  }
}

// A lane's tags repeat every 4096 sequence numbers: the 4097th collective
// in flight is refused (CommunicationError, nothing submitted), never given
// the tags of one still in flight; once they completed, calls go on.
TEST(After, MoreCollectivesInFlightThanTagsAreRefused) {
  auto comm = world();
  const int n = comm->size();
  if (n < 2) GTEST_SKIP() << "one rank's collectives complete at the call";
  auto gate = std::make_shared<Work>("gate");
  std::vector<int32_t> values(4096);
  std::vector<WorkPtr> held;
  AllreduceOptions o;
  o.after = gate;
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<int32_t>(i);
    held.push_back(comm->allreduce(TensorView::host(&values[i], 1), ExecContext::host(), o));
  }
  int32_t one = 1;
  try {
    comm->allreduce(TensorView::host(&one, 1), ExecContext::host());
    ADD_FAILURE() << "the 4097th collective in flight was accepted";
  } catch (const CommunicationError& e) {
    EXPECT_NE(std::string(e.what()).find("in flight"), std::string::npos) << e.what();
  }
  gate->complete(nullptr);
  for (WorkPtr& w : held) w->wait();
  for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(values[i], static_cast<int32_t>(i) * n) << i;
  held.clear();
  comm->allreduce(TensorView::host(&one, 1), ExecContext::host())->wait();
  EXPECT_EQ(one, n);
}

// ---- compute ------------------------------------------------------------------

// encode -> collective -> decode, each stage after the one before, the local
// stages off the caller's thread: the collective reads what the first stage
// wrote, the last stage reads the collective's result.
TEST(Compute, StagesAroundACollectiveRunOffTheCallersThreadInOrder) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  for (int64_t count : {int64_t{1}, int64_t{(1 << 16) + 3}}) {
    Buffer b(DType::i64, count);
    std::vector<int64_t> doubled(static_cast<size_t>(count));
    std::thread::id encode_thread, decode_thread;
    WorkPtr encoded = comm->compute([&] {
      encode_thread = std::this_thread::get_id();
      test::fill(b, r);
    });
    AllreduceOptions o;
    o.after = encoded;
    WorkPtr summed = comm->allreduce(b.view(), ExecContext::host(), o);
    OpOptions d;
    d.after = summed;
    d.label = "decode";
    WorkPtr decoded = comm->compute(
        [&] {
          decode_thread = std::this_thread::get_id();
          for (int64_t i = 0; i < count; ++i) doubled[i] = 2 * b.as<int64_t>()[i];
        },
        d);
    decoded->wait();
    EXPECT_TRUE(encoded->is_completed() && summed->is_completed());
    EXPECT_NE(encode_thread, std::this_thread::get_id());
    EXPECT_NE(decode_thread, std::this_thread::get_id());
    EXPECT_NE(decoded->description().find("compute"), std::string::npos) << decoded->description();
    EXPECT_NE(decoded->description().find("decode"), std::string::npos) << decoded->description();
    for (int64_t i = 0; i < count; ++i)
      ASSERT_EQ(doubled[i], 2 * test::expected_reduction<int64_t>(i, ReduceOp::sum, n))
          << "count " << count << " index " << i;
  }
}

// What the function throws is the Work's error; a failed dependency fails the
// Work without running the function; the communicator stays usable.
TEST(Compute, ErrorsAndFailedDependencies) {
  auto comm = world();
  WorkPtr thrown = comm->compute([] { RELAXCC_THROW(CorruptPayload, "test: bad bytes"); });
  EXPECT_THROW(thrown->wait(), CorruptPayload);
  auto gate = std::make_shared<Work>("gate");
  bool ran = false;
  OpOptions o;
  o.after = gate;
  WorkPtr dependent = comm->compute([&] { ran = true; }, o);
  gate->complete(std::make_exception_ptr(
      InvalidArgument("test: the stage before failed", __FILE__, __LINE__)));
  EXPECT_THROW(dependent->wait(), CommunicationError);
  EXPECT_FALSE(ran);
  EXPECT_THROW(comm->compute(nullptr), InvalidArgument);
  Buffer b(DType::i32, 3);
  test::fill(b, comm->rank());
  comm->allreduce(b.view(), ExecContext::host())->wait();
  for (int64_t i = 0; i < 3; ++i)
    ASSERT_EQ(b.as<int32_t>()[i],
              test::expected_reduction<int32_t>(i, ReduceOp::sum, comm->size()));
}

// ---- groups -------------------------------------------------------------------

// Threads and resident memory of this process, from /proc/self/status.
std::pair<int, int64_t> threads_and_rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string key;
  int threads = 0;
  int64_t rss = 0;
  while (status >> key) {
    if (key == "Threads:")
      status >> threads;
    else if (key == "VmRSS:")
      status >> rss;
  }
  return {threads, rss};
}

// Every collective on a group whose rank order differs from its parent's:
// results in group ranks, exact.
TEST(Groups, EveryCollectiveInGroupRanks) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  std::vector<int> members(n);
  for (int i = 0; i < n; ++i) members[i] = n - 1 - i;  // reversed
  auto g = comm->group(members);
  ASSERT_EQ(g->size(), n);
  const int gr = g->rank();
  ASSERT_EQ(gr, n - 1 - r);
  for (int64_t count : {int64_t{0}, int64_t{5}, int64_t{1001}, int64_t{(1 << 17) + 3}}) {
    for (AllreduceAlgo algo : {AllreduceAlgo::ring, AllreduceAlgo::recursive_doubling}) {
      Buffer b(DType::i64, count);
      test::fill(b, gr);
      AllreduceOptions o;
      o.algo = algo;
      g->allreduce(b.view(), ExecContext::host(), o)->wait();
      ASSERT_EQ(
          count_wrong<int64_t>(
              b, [&](int64_t i) { return test::expected_reduction<int64_t>(i, ReduceOp::sum, n); }),
          0)
          << "count " << count;
    }
    Buffer in(DType::i32, count * n), out(DType::i32, count);
    test::fill(in, gr);
    g->reduce_scatter(in.view(), out.view(), ExecContext::host())->wait();
    ASSERT_EQ(count_wrong<int32_t>(out,
                                   [&](int64_t i) {
                                     return test::expected_reduction<int32_t>(gr * count + i,
                                                                              ReduceOp::sum, n);
                                   }),
              0);
    Buffer mine(DType::i32, count), all(DType::i32, count * n);
    test::fill(mine, gr);
    g->allgather(mine.view(), all.view(), ExecContext::host())->wait();
    ASSERT_EQ(count_wrong<int32_t>(all,
                                   [&](int64_t i) {
                                     return static_cast<int32_t>(test::encode(
                                         static_cast<int>(i / std::max<int64_t>(count, 1)),
                                         i % std::max<int64_t>(count, 1)));
                                   }),
              0);
    for (int root = 0; root < n; ++root) {
      Buffer bc(DType::f32, count);
      test::fill(bc, gr == root ? root : 99);
      BroadcastOptions bo;
      bo.root = root;
      g->broadcast(bc.view(), ExecContext::host(), bo)->wait();
      ASSERT_EQ(count_wrong<float>(
                    bc, [&](int64_t i) { return static_cast<float>(test::encode(root, i)); }),
                0)
          << "root " << root << " count " << count;
    }
    Buffer a_in(DType::i64, count * n), a_out(DType::i64, count * n);
    for (int p = 0; p < n; ++p)
      for (int64_t j = 0; j < count; ++j)
        a_in.as<int64_t>()[p * count + j] = gr * 1000000 + p * 1000 + j;
    g->alltoall(a_in.view(), a_out.view(), ExecContext::host())->wait();
    for (int p = 0; p < n; ++p)
      for (int64_t j = 0; j < count; ++j)
        ASSERT_EQ(a_out.as<int64_t>()[p * count + j], p * 1000000 + gr * 1000 + j);
  }
  g->barrier()->wait();
  if (n > 1) {
    const int right = (gr + 1) % n, left = (gr - 1 + n) % n;
    Buffer out(DType::i32, 100), in(DType::i32, 100);
    test::fill(out, gr);
    g->point_to_point({P2POp::send(right, out.view(), 3), P2POp::recv(left, in.view(), 3)},
                      ExecContext::host())
        ->wait();
    ASSERT_EQ(count_wrong<int32_t>(
                  in, [&](int64_t i) { return static_cast<int32_t>(test::encode(left, i)); }),
              0);
  }
}

// Groups with the same members and different keys, used at the same time and
// called in opposite orders on different ranks, never mix.
TEST(Groups, SameMembersDifferentKeysDoNotMix) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  std::vector<int> all(n);
  std::iota(all.begin(), all.end(), 0);
  GroupOptions k1, k2;
  k1.key = 1;
  k2.key = 2;
  auto g1 = comm->group(all, k1), g2 = comm->group(all, k2);
  Buffer a(DType::i32, 1000), b(DType::i32, 1000);
  test::fill(a, r);
  test::fill(b, r, 5);
  WorkPtr wa, wb;
  if (r % 2 == 0) {
    wa = g1->allreduce(a.view(), ExecContext::host());
    wb = g2->allreduce(b.view(), ExecContext::host());
  } else {
    wb = g2->allreduce(b.view(), ExecContext::host());
    wa = g1->allreduce(a.view(), ExecContext::host());
  }
  wa->wait();
  wb->wait();
  ASSERT_EQ(
      count_wrong<int32_t>(
          a, [&](int64_t i) { return test::expected_reduction<int32_t>(i, ReduceOp::sum, n); }),
      0);
  ASSERT_EQ(
      count_wrong<int32_t>(
          b, [&](int64_t i) { return test::expected_reduction<int32_t>(i + 5, ReduceOp::sum, n); }),
      0);
}

// Built with ThreadSanitizer (GCC defines __SANITIZE_THREAD__, Clang has
// the feature).
#if defined(__SANITIZE_THREAD__)
#define RELAXCC_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RELAXCC_TEST_TSAN 1
#endif
#endif
#ifndef RELAXCC_TEST_TSAN
#define RELAXCC_TEST_TSAN 0
#endif

// Moshpit and gossip make thousands of groups: 10,000 group allreduces over
// changing members add no thread, no transport communicator and no memory.
TEST(Groups, TenThousandGroupAllreducesOverChangingMembers) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  constexpr int kRounds = 10000;
  int64_t bound_kib = 0;
  std::pair<int, int64_t> before{};
  for (int round = 0; round < kRounds; ++round) {
    if (round == 100) before = threads_and_rss_kib();  // after warm-up (pools, mappings)
    // Odd rounds: ranks of the same parity; even rounds: everyone, rotated.
    std::vector<int> members;
    if (round % 2 == 1) {
      for (int p = r % 2; p < n; p += 2) members.push_back(p);
    } else {
      for (int k = 0; k < n; ++k) members.push_back((k + round) % n);
    }
    GroupOptions o;
    o.key = static_cast<uint64_t>(round);
    auto g = comm->group(members, o);
    int32_t data[4] = {r + 1, round, 1, -r};
    g->allreduce(TensorView::host(data, 4), ExecContext::host())->wait();
    int32_t want0 = 0, want3 = 0;
    for (int m : members) {
      want0 += m + 1;
      want3 -= m;
    }
    const int gs = static_cast<int>(members.size());
    ASSERT_EQ(data[0], want0) << "round " << round;
    ASSERT_EQ(data[1], round * gs);
    ASSERT_EQ(data[2], gs);
    ASSERT_EQ(data[3], want3);
  }
  const auto after = threads_and_rss_kib();
  EXPECT_EQ(after.first, before.first) << "threads";
  bound_kib = 8 * 1024;
#if RELAXCC_TEST_TSAN
  // ThreadSanitizer's allocator returns freed memory to the system and
  // faults it back in (after a test that held 4096 operations in flight):
  // its resident size measures no leak. The ci build asserts the bound.
  static_cast<void>(bound_kib);
#else
  EXPECT_LT(after.second - before.second, bound_kib)
      << "resident memory grew by " << after.second - before.second << " KiB";
#endif
}

// A communicator created to share another's engine adds no thread, and the
// two run side by side: a large low-priority allreduce on one and small
// high-priority ones on the other, each checked exactly.
TEST(Engines, SharedEngineAddsNoThreadAndRunsBothFamilies) {
  RELAXCC_SKIP_ON_UCX("share_engine_with is an option of create_mpi_communicator");
  auto comm = world();
  const int n = comm->size();
  const auto before = threads_and_rss_kib();
  MpiCommunicatorOptions options;
  options.share_engine_with = comm;
  auto other = create_mpi_communicator(options);
  EXPECT_EQ(threads_and_rss_kib().first, before.first) << "threads";
  Buffer large(DType::i32, 1 << 20);
  test::fill(large, comm->rank());
  AllreduceOptions low;
  low.priority = -1;
  auto background = other->allreduce(large.view(), ExecContext::host(), low);
  for (int k = 0; k < 10; ++k) {
    Buffer small(DType::i32, 1000);
    test::fill(small, comm->rank(), k);
    comm->allreduce(small.view(), ExecContext::host())->wait();
    ASSERT_EQ(
        count_wrong<int32_t>(
            small,
            [&](int64_t i) { return test::expected_reduction<int32_t>(i + k, ReduceOp::sum, n); }),
        0);
  }
  background->wait();
  ASSERT_EQ(
      count_wrong<int32_t>(
          large, [&](int64_t i) { return test::expected_reduction<int32_t>(i, ReduceOp::sum, n); }),
      0);
}

TEST(Groups, BadMembersAndReservedKeysAreRejected) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  EXPECT_THROW(comm->group({r, n}), InvalidArgument);
  EXPECT_THROW(comm->group({r, r}), InvalidArgument);
  GroupOptions reserved;
  reserved.key = uint64_t{1} << 63;  // the keys of split-made groups
  EXPECT_THROW(comm->group({r}, reserved), InvalidArgument);
  if (n > 1) {
    EXPECT_THROW(comm->group({(r + 1) % n}), InvalidArgument);
  }
}

TEST(Stats, TraceFilePerCommunicator) {
  int pid0 = static_cast<int>(getpid());
  MPI_Bcast(&pid0, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const std::string prefix = detail::concat("/tmp/relaxcc_trace_test_", pid0);
  const int r = test::world_rank();
  {
    MpiCommunicatorOptions options;
    options.tunables = Tunables::from_env();
    options.tunables.trace_file = prefix;
    auto first = test::create_communicator(options.tunables);
    auto second = test::create_communicator(options.tunables);
    // One buffer per communicator: the two allreduces run at the same time.
    Buffer b1(DType::i32, 1 << 12), b2(DType::i32, 1 << 12);
    for (int i = 0; i < 20; ++i) {
      auto w1 = first->allreduce(b1.view(), ExecContext::host());
      auto w2 = second->allreduce(b2.view(), ExecContext::host());
      w1->wait();
      w2->wait();
    }
  }
  const std::regex event(
      R"(\{"name":"[a-z_]+","cat":"[a-z]+","ph":"X","pid":\d+,"tid":\d+,"ts":\d+,"dur":\d+,"args":\{.*\}\},?)");
  for (const std::string& path :
       {detail::concat(prefix, ".", r, ".json"), detail::concat(prefix, ".", r, ".1.json")}) {
    std::ifstream in(path);
    ASSERT_TRUE(in.good()) << path;
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    ASSERT_GE(lines.size(), 3u) << path;
    EXPECT_EQ(lines.front(), "[") << path;
    EXPECT_EQ(lines.back(), "]") << path;
    int ops = 0;
    for (size_t i = 1; i + 1 < lines.size(); ++i) {
      if (lines[i].empty()) continue;
      ASSERT_TRUE(std::regex_match(lines[i], event))
          << path << " line " << i + 1 << ": " << lines[i];
      ops += lines[i].find("\"cat\":\"op\"") != std::string::npos ? 1 : 0;
    }
    // On 2 or more ranks the handshake (an allgather) and the 20 allreduces.
    EXPECT_GE(ops, test::world_size() > 1 ? 21 : 0) << path;
    std::remove(path.c_str());
  }
}

TEST(Stats, CountBytesPerPeer) {
  auto comm = world();
  if (comm->size() == 1) GTEST_SKIP() << "no peers";
  const CommStats before = comm->stats();
  Buffer b(DType::f32, 1 << 16);
  AllreduceOptions o;
  o.algo = AllreduceAlgo::ring;
  comm->allreduce(b.view(), ExecContext::host(), o)->wait();
  const CommStats after = comm->stats();
  const int right = (comm->rank() + 1) % comm->size();
  // The ring sends 2(n-1)/n of the data to the right neighbour, plus headers.
  const uint64_t data = 2ull * (comm->size() - 1) * (b.view().nbytes() / comm->size());
  EXPECT_GE(after.sent_to[right] - before.sent_to[right], data);
  EXPECT_LT(after.sent_to[right] - before.sent_to[right], data + 4096);
  EXPECT_GT(after.operations, before.operations);
}

}  // namespace
}  // namespace relaxcc
