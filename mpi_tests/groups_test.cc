// Groups (Communicator::group) kept apart on the wire: two groups that share
// members never read each other's messages, whatever their keys, while both
// live and after one of them was poisoned with messages still in flight; and
// what poisoned groups leave behind stays bounded.
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "relaxcc/errors.h"
#include "relaxcc/tunables.h"
#include "src/engine/engine.h"
#include "src/engine/op_header.h"
#include "test_util.h"

namespace relaxcc {
namespace {

using test::Buffer;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A communicator of its own per test, over a duplicate of MPI_COMM_WORLD:
// what one test leaves parked cannot reach the next.
CommunicatorPtr fresh_world(std::chrono::milliseconds timeout = 10000ms) {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  MpiCommunicatorOptions o;
  o.comm = c;
  o.tunables = Tunables::from_env();
  o.tunables.timeout_ms = timeout.count();
  o.timeout = timeout;
  return create_mpi_communicator(o);
}

int64_t rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string key;
  int64_t rss = 0;
  while (status >> key)
    if (key == "VmRSS:") status >> rss;
  return rss;
}

// What rank `rank` contributes at element `i` of call `salt`: distinct
// across ranks, elements and calls, so that data read by the wrong group or
// call shows.
int32_t value(int rank, int64_t i, int salt) {
  return (rank + 1) * 1000000 + static_cast<int32_t>((i * 31 + salt * 977) % 1000000);
}
void fill(Buffer& b, int rank, int salt) {
  for (int64_t i = 0; i < b.numel; ++i) b.as<int32_t>()[i] = value(rank, i, salt);
}
// An allreduce (sum) of `b`, filled with fill(b, m, salt) on every member m
// (ranks of the parent): exact.
void check_allreduce(Buffer& b, const std::vector<int>& members, int salt) {
  for (int64_t i = 0; i < b.numel; ++i) {
    int64_t want = 0;
    for (int m : members) want += value(m, i, salt);
    ASSERT_EQ(b.as<int32_t>()[i], static_cast<int32_t>(want))
        << "element " << i << " of call " << salt;
  }
}

// Keys 14489 and 19499 of members {1, 3} once mapped to one transport tag
// (1329573892 with Open MPI's ob1). Both groups live at once: allreduces
// submitted in opposite orders on the two ranks, small (the direct path) and
// large (the ring's pipeline), complete exactly. Then rank 3 poisons the
// first with a message that rank 1 never receives (its allreduce, which
// rank 1 skips, times out), while the second goes on past that message's
// sequence number, exactly, and rank 1 learns of the poisoning. Later
// groups of the same members, one of them with ga's first-choice window,
// stay apart from the message still queued.
TEST(Groups, KeysThatOnceSharedTagsStayApart) {
  auto comm = fresh_world();
  const int n = comm->size(), r = comm->rank();
  if (n < 4) GTEST_SKIP() << "needs ranks 1 and 3";
  if (r == 1 || r == 3) {
    const std::vector<int> members{1, 3};
    auto ga = comm->group(members, {.key = 14489});
    auto gb = comm->group(members, {.key = 19499});
    // Both live, opposite orders.
    int round = 0;
    for (int64_t count : {int64_t{16}, int64_t{3000}, int64_t{200000}, int64_t{16}}) {
      ++round;
      Buffer a(DType::i32, count), b(DType::i32, count);
      fill(a, r, round);
      fill(b, r, 1000 + round);
      WorkPtr wa, wb;
      if (r == 1) {
        wa = ga->allreduce(a.view(), ExecContext::host());
        wb = gb->allreduce(b.view(), ExecContext::host());
      } else {
        wb = gb->allreduce(b.view(), ExecContext::host());
        wa = ga->allreduce(a.view(), ExecContext::host());
      }
      wa->wait(10s);
      wb->wait(10s);
      check_allreduce(a, members, round);
      check_allreduce(b, members, 1000 + round);
    }
    // ga's next operation (#5): rank 3 alone, so its header (and first
    // data) stay in rank 1's queue, never received.
    if (r == 3) {
      Buffer a(DType::i32, 16);
      fill(a, r, 0);
      try {
        ga->allreduce(a.view(), ExecContext::host())->wait(300ms);
        ADD_FAILURE() << "rank 3: allreduce without rank 1 completed";
      } catch (const Timeout&) {
      }
      EXPECT_TRUE(ga->poisoned());
    }
    // gb goes on through the same sequence numbers (#5 and later), exactly.
    for (int k = 0; k < 6; ++k) {
      for (int64_t count : {int64_t{16}, int64_t{3000}}) {
        Buffer b(DType::i32, count);
        fill(b, r, 2000 + k);
        gb->allreduce(b.view(), ExecContext::host())->wait(10s);
        check_allreduce(b, members, 2000 + k);
      }
    }
    // Rank 1 learns of the poisoning (the notice names rank 3's timeout).
    if (r == 1) {
      const auto deadline = Clock::now() + 5s;
      while (!ga->poisoned() && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
      EXPECT_TRUE(ga->poisoned());
      try {
        ga->barrier()->wait(10s);
        ADD_FAILURE() << "rank 1: a poisoned group ran a barrier";
      } catch (const CommunicatorPoisoned& e) {
        EXPECT_NE(std::string(e.what()).find("by rank 1"), std::string::npos) << e.what();
      }
    }
    // A new group of the same members after the poisoning: apart from the
    // message still queued at rank 1.
    auto gc = comm->group(members, {.key = 14490});
    Buffer c(DType::i32, 3000);
    fill(c, r, 7);
    for (int k = 0; k < 6; ++k) gc->barrier()->wait(10s);
    gc->allreduce(c.view(), ExecContext::host())->wait(10s);
    check_allreduce(c, members, 7);
    // A group whose first-choice window is ga's (the same members, a key
    // the window count away), while ga (poisoned, its message still queued
    // at rank 1) lives: it takes another window and never reads that message.
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    ASSERT_TRUE(flag);
    auto gd = comm->group(members, {.key = 14489 + engine::group_windows(*ub)});
    for (int k = 0; k < 6; ++k) {
      Buffer d(DType::i32, 16);
      fill(d, r, 50 + k);
      gd->allreduce(d.view(), ExecContext::host())->wait(10s);
      check_allreduce(d, members, 50 + k);
    }
  }
  comm->barrier()->wait(30s);
}

// Random groups, two live at a time that share members, allreduces submitted
// in opposite orders on odd and even ranks, and deliberate timeouts: in one
// round of four a member of the first group skips its allreduce (the others
// time out, it calls late, sending messages nobody receives). Half the
// rounds give both groups keys whose first-choice tag window is the same as
// every other such round's (the same members, keys a multiple of the window
// count apart), so that every group of those rounds must find another. The
// second group's allreduce is exact every round. What the poisoned groups
// leave behind stays bounded: resident memory, and no lane, operation or
// reserved window beyond the bound per pair (TagWindows::kRetired).
TEST(Groups, SoakOfRandomGroupsWithDeliberateTimeouts) {
  auto comm = fresh_world();
  const int n = comm->size(), r = comm->rank();
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  ASSERT_TRUE(flag);
  const uint64_t windows = engine::group_windows(*ub);
  ASSERT_GT(windows, 0u);
  const double seconds = Tunables::from_env().soak_seconds;
  std::vector<int> everyone(n);
  std::iota(everyone.begin(), everyone.end(), 0);
  const auto t0 = Clock::now();
  int64_t rss_start = 0;
  int timeouts = 0, rounds = 0;
  for (int round = 1;; ++round) {
    // Every rank goes on as rank 0 says (the time budget).
    int32_t go = Clock::now() - t0 < std::chrono::duration<double>(seconds) ? 1 : 0;
    comm->broadcast(TensorView::host(&go, 1), ExecContext::host())->wait(30s);
    if (!go) break;
    ++rounds;
    if (round == 20) rss_start = rss_kib();  // after warm-up (pools, mappings)
    std::mt19937_64 rng(static_cast<uint64_t>(round) * 7919);
    std::vector<int> m1, m2;
    GroupOptions k1, k2;
    if (round % 2 == 0) {
      // The same members and first-choice window every such round.
      m1 = m2 = everyone;
      k1.key = static_cast<uint64_t>(round) * windows;
      k2.key = static_cast<uint64_t>(round + 1) * windows;
    } else {
      std::vector<int> order = everyone;
      std::shuffle(order.begin(), order.end(), rng);
      m1.assign(order.begin(), order.begin() + 2 + static_cast<int>(rng() % (n - 1)));
      // m2 shares m1's first two members (so a pair), plus random others.
      m2.assign(m1.begin(), m1.begin() + 2);
      for (int p : order)
        if (std::find(m2.begin(), m2.end(), p) == m2.end() && rng() % 2 == 0) m2.push_back(p);
      std::shuffle(m2.begin(), m2.end(), rng);
      k1.key = rng() >> 1;
      k2.key = rng() >> 1;
    }
    const bool deliberate = rng() % 4 == 0;
    const int skipper = m1[rng() % m1.size()];
    const int64_t count = std::array<int64_t, 3>{8, 1000, 40000}[rng() % 3];
    const bool in1 = std::find(m1.begin(), m1.end(), r) != m1.end();
    const bool in2 = std::find(m2.begin(), m2.end(), r) != m2.end();
    CommunicatorPtr g1 = in1 ? comm->group(m1, k1) : nullptr;
    CommunicatorPtr g2 = in2 ? comm->group(m2, k2) : nullptr;
    Buffer a(DType::i32, count), b(DType::i32, count);
    fill(a, r, round);
    fill(b, r, round + 500000);
    WorkPtr w1, w2;
    const bool skip = deliberate && r == skipper;
    const auto submit1 = [&] {
      if (g1 && !skip) w1 = g1->allreduce(a.view(), ExecContext::host());
    };
    const auto submit2 = [&] {
      if (g2) w2 = g2->allreduce(b.view(), ExecContext::host());
    };
    if (r % 2 == 0) {
      submit1();
      submit2();
    } else {
      submit2();
      submit1();
    }
    if (w2) {
      w2->wait(10s);
      check_allreduce(b, m2, round + 500000);
    }
    if (w1) {
      if (deliberate) {
        try {
          w1->wait(100ms);
          ADD_FAILURE() << "round " << round << ": completed without rank " << skipper;
        } catch (const Timeout&) {
        } catch (const CommunicatorPoisoned&) {
        }
      } else {
        w1->wait(10s);
        check_allreduce(a, m1, round);
      }
    }
    if (deliberate) {
      // Everyone timed out: the skipper calls late.
      comm->barrier()->wait(30s);
      if (skip) {
        // It fails (the notice came first, or nobody answers), or completes
        // with what the others had sent before they gave up.
        try {
          g1->allreduce(a.view(), ExecContext::host())->wait(100ms);
        } catch (const Timeout&) {
        } catch (const CommunicatorPoisoned&) {
        }
      }
      ++timeouts;
    }
    g1.reset();
    g2.reset();
    if (HasFatalFailure()) return;
  }
  const int64_t grown = rss_kib() - rss_start;
  // kRetired more groups of every pair: no window of the poisoned ones is
  // held any more, their late messages drained, and so nothing of them (no
  // lane, no operation parked on a send nobody received) stays.
  for (size_t k = 0; k <= engine::TagWindows::kRetired; ++k) {
    auto g = comm->group(everyone, {.key = (uint64_t{1} << 62) + k});
    g->barrier()->wait(10s);
  }
  comm->barrier()->wait(30s);
  CommStats stats = comm->stats();
  for (const auto deadline = Clock::now() + 5s;
       (stats.engine_lanes > 1 || stats.engine_operations > 0) && Clock::now() < deadline;
       stats = comm->stats())
    std::this_thread::sleep_for(10ms);
  std::printf(
      "rank %d: %d rounds, %d with a deliberate timeout, resident memory %+lld KiB; engine: %lld "
      "lanes, %lld operations, %lld group tag windows\n",
      r, rounds, timeouts, static_cast<long long>(grown),
      static_cast<long long>(stats.engine_lanes), static_cast<long long>(stats.engine_operations),
      static_cast<long long>(stats.group_windows));
  EXPECT_GE(timeouts, 10);
  EXPECT_EQ(stats.engine_lanes, 1);  // comm's own
  EXPECT_EQ(stats.engine_operations, 0);
  EXPECT_EQ(stats.group_windows, static_cast<int64_t>((n - 1) * engine::TagWindows::kRetired));
  // A poisoned group once kept 200-240 KiB (a parked send and its buffers):
  // 20 or more of them would show.
  EXPECT_LT(grown, 4096) << "resident memory grew by " << grown << " KiB";
  comm->barrier()->wait(30s);
}

}  // namespace
}  // namespace relaxcc
