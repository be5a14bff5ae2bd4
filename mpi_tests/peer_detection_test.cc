// Failure detection on the UCX wing (src/engine/heartbeat.h, src/ucx):
// ranks this program forks itself (no mpirun) run engine communicators over
// UcxTransport, exchanging their worker blobs through files. Each test kills
// or stops one rank while the others run allreduces and asserts when and how
// every survivor learns of it; one asserts that heartbeats make no false
// report when ranks share 2 CPUs and compute for long between operations.
//   RELAXCC_DETECT_TRIALS=<n>  trials of the SIGKILL test (default 20) and of
//                              the SIGSTOP test (default 10)
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "child_processes.h"
#include "relaxcc/communicator.h"
#include "relaxcc/errors.h"
#include "relaxcc/exec_context.h"
#include "relaxcc/tensor.h"
#include "relaxcc/tunables.h"
#include "src/communicator/engine_communicator.h"
#include "src/ucx/ucx_transport.h"
#include "src/ucx/worker.h"

namespace relaxcc::ucx {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int kMaxRanks = 8;

int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// What a rank saw, in memory shared with the parent.
struct Outcome {
  std::atomic<int64_t> failed_ns{0};  // CLOCK_MONOTONIC of the first error (0: none)
  std::atomic<int> peer{-1};          // PeerLost::peer(), or -1
  std::atomic<int64_t> op_ns{0};      // the cost test: nanoseconds per allreduce
  std::atomic<int64_t> start_ns{0};   // CLOCK_MONOTONIC when it began its creation
  char what[512] = {};
};
struct Shared {
  std::atomic<int> ready{0};     // ranks in their loop
  std::atomic<int> reported{0};  // ranks whose allreduce failed
  std::atomic<int64_t> signal_ns{0};
  Outcome outcome[kMaxRanks];
};

// `n` forked ranks, each running body(comm, rank, shared) on an engine
// communicator over UCX with `peer_timeout_ms`; a child's GoogleTest failures
// or exception become its exit code. Rank `stops` (-1: none) connects and
// then stops itself (SIGSTOP) before its communicator exists, never sending
// a heartbeat: the others' creation errors are then their Outcome, and their
// creation timeout is kStoppedCreationTimeout. Rank `slow` (-1: none) waits
// kSlowCreation between connecting and creating its communicator.
constexpr auto kStoppedCreationTimeout = 3s;
constexpr auto kSlowCreation = 1500ms;
class World {
 public:
  using Body = std::function<void(Communicator&, int, Shared&)>;
  World(int n, int64_t peer_timeout_ms, Body body, int stops = -1, int slow = -1)
      : n_(n), stops_(stops), slow_(slow) {
    void* p =
        mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    shared_ = new (p) Shared();
    std::fflush(stdout);
    for (int r = 0; r < n; ++r) {
      const pid_t pid = fork();
      if (pid == 0) _exit(run(r, peer_timeout_ms, body));
      pids_.push_back(pid);
    }
  }
  ~World() {
    test::kill_children(pids_);
    munmap(shared_, sizeof(Shared));
  }
  Shared& shared() { return *shared_; }

  // Waits until every rank is in its loop.
  bool await_ready() {
    const auto deadline = Clock::now() + 30s;
    while (shared_->ready.load() < n_ && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
    return shared_->ready.load() >= n_;
  }
  void signal(int rank, int sig) {
    shared_->signal_ns.store(monotonic_ns());
    ::kill(pids_[static_cast<size_t>(rank)], sig);
  }
  // Waits for every rank but `victim` (-1: none) to exit, EXPECTing 0 from
  // each; kills the victim.
  void join(std::chrono::seconds timeout, int victim = -1) {
    test::join_children(pids_, timeout, {victim});
  }

 private:
  int run(int rank, int64_t peer_timeout_ms, const Body& body) {
    try {
      auto worker = std::make_shared<Worker>(std::make_shared<Context>());
      // Heartbeats over UDP, as create_ucx_communicator sets them up.
      EndpointOptions eo;
      eo.liveness = std::make_shared<engine::UdpSocket>();
      blobs_.publish(rank, worker->blob(eo.liveness.get()));
      std::vector<Blob> blobs;
      for (int r = 0; r < n_; ++r) blobs.push_back(blobs_.read(r, 20s));
      UcxConnection c = connect(worker, blobs, rank, eo);
      if (rank == stops_) {
        ::raise(SIGSTOP);
        return 0;
      }
      if (rank == slow_) std::this_thread::sleep_for(kSlowCreation);
      engine::EngineCommunicatorOptions o;
      o.tunables.peer_timeout_ms = peer_timeout_ms;
      o.timeout = stops_ >= 0 ? kStoppedCreationTimeout : 20s;
      o.creator = "peer_detection_test";
      Outcome& out = shared_->outcome[rank];
      out.start_ns.store(monotonic_ns());
      CommunicatorPtr comm;
      try {
        comm = engine::create_engine_communicator(c.transport, c.endpoints, o);
      } catch (const Error& e) {
        if (stops_ < 0) throw;
        out.failed_ns.store(monotonic_ns());
        if (const auto* lost = dynamic_cast<const PeerLost*>(&e)) out.peer.store(lost->peer());
        std::snprintf(out.what, sizeof(out.what), "%s", e.what());
        return 0;
      }
      body(*comm, rank, *shared_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[rank %d] exception: %s\n", rank, e.what());
      std::fflush(stderr);
      return 2;
    }
    std::fflush(stdout);
    return testing::Test::HasFailure() ? 1 : 0;
  }
  const int n_;
  const int stops_;
  const int slow_;
  Shared* shared_ = nullptr;
  test::BlobDirectory blobs_{"relaxcc_detect"};
  std::vector<pid_t> pids_;
};

// Allreduces of `count` i64 whose values encode the rank and the index,
// checked exactly, until one fails (recorded in the rank's Outcome) or
// `for_how_long` passed. `ready` counts this rank in once it has run one.
// After a failure the rank stays until every survivor's failed (at most
// 5 s): a survivor that left at once would be reported lost itself.
void allreduce_until_failure(Communicator& comm, int me, Shared& s, int64_t count,
                             std::chrono::milliseconds for_how_long) {
  const int n = comm.size();
  std::vector<int64_t> v(static_cast<size_t>(count));
  const auto end = Clock::now() + for_how_long;
  bool counted = false;
  try {
    for (int64_t it = 0; Clock::now() < end; ++it) {
      for (int64_t i = 0; i < count; ++i) v[static_cast<size_t>(i)] = (me + 1) * 1000 + i + it;
      comm.allreduce(TensorView(v.data(), count, DType::i64), ExecContext::host(), {})->wait();
      for (int64_t i = 0; i < count; ++i)
        ASSERT_EQ(v[static_cast<size_t>(i)], int64_t{n} * (n + 1) / 2 * 1000 + n * (i + it))
            << "index " << i << " iteration " << it;
      if (!std::exchange(counted, true)) s.ready.fetch_add(1);
    }
  } catch (const PeerLost& e) {
    s.outcome[me].failed_ns.store(monotonic_ns());
    s.outcome[me].peer.store(e.peer());
    std::snprintf(s.outcome[me].what, sizeof(s.outcome[me].what), "%s", e.what());
  } catch (const Error& e) {
    s.outcome[me].failed_ns.store(monotonic_ns());
    std::snprintf(s.outcome[me].what, sizeof(s.outcome[me].what), "%s", e.what());
  }
  if (s.outcome[me].failed_ns.load() == 0) return;
  s.reported.fetch_add(1);
  const auto until = Clock::now() + 5s;
  while (s.reported.load() < n - 1 && Clock::now() < until) std::this_thread::sleep_for(1ms);
}

// Whether `o` reports the loss of `victim`: PeerLost naming it (a survivor
// that learns of the loss from a peer's notice or abort record too).
bool names_victim(const Outcome& o, int victim) {
  return o.peer.load() == victim;
}

int trials(int fallback) {
  const int64_t n = Tunables::from_env().detect_trials;
  return n > 0 ? static_cast<int>(n) : fallback;
}

// Kills or stops one rank of 4 in each of `n_trials` worlds while the others
// run allreduces; EXPECTs every survivor to report it within `bound`.
// Prints the reporting times (min, median, max over every survivor).
void detect(int sig, int64_t peer_timeout_ms, std::chrono::milliseconds bound, int n_trials) {
  constexpr int kRanks = 4;
  std::vector<double> ms;
  for (int t = 0; t < n_trials; ++t) {
    const int victim = 1 + t % (kRanks - 1);  // rank 0 too, below
    const int chosen = t % kRanks == 3 ? 0 : victim;
    World w(kRanks, peer_timeout_ms, [](Communicator& comm, int me, Shared& s) {
      allreduce_until_failure(comm, me, s, 16, 30s);
    });
    ASSERT_TRUE(w.await_ready()) << "trial " << t;
    std::this_thread::sleep_for(50ms);
    w.signal(chosen, sig);
    w.join(20s, chosen);
    for (int r = 0; r < kRanks; ++r) {
      if (r == chosen) continue;
      const Outcome& o = w.shared().outcome[r];
      ASSERT_NE(o.failed_ns.load(), 0) << "trial " << t << ": rank " << r << " saw no error";
      const double took =
          static_cast<double>(o.failed_ns.load() - w.shared().signal_ns.load()) / 1e6;
      ms.push_back(took);
      EXPECT_TRUE(names_victim(o, chosen)) << "trial " << t << ": rank " << r << ": " << o.what;
      EXPECT_LT(took, static_cast<double>(bound.count()))
          << "trial " << t << ": rank " << r << " reported rank " << chosen << " after " << took
          << " ms: " << o.what;
    }
  }
  std::sort(ms.begin(), ms.end());
  std::printf(
      "%s, RELAXCC_PEER_TIMEOUT_MS=%lld, %d trials x %d survivors: min %.1f ms, median "
      "%.1f ms, max %.1f ms\n",
      sig == SIGKILL ? "SIGKILL" : "SIGSTOP", static_cast<long long>(peer_timeout_ms), n_trials,
      kRanks - 1, ms.front(), ms[ms.size() / 2], ms.back());
}

TEST(PeerDetection, KilledPeerReportedWithin500ms) {
  detect(SIGKILL, 2000, 500ms, trials(20));
}

TEST(PeerDetection, StoppedPeerReportedWithinTimeoutPlus300ms) {
  detect(SIGSTOP, 500, 800ms, trials(10));
}

// A peer that never sends a heartbeat (it stops before its communicator
// exists) is reported by name one peer timeout before the creation's
// timeout (plus 500 ms of slack for a loaded machine), before the
// handshake's own Timeout.
TEST(PeerDetection, PeerNeverHeardFromReportedBeforeCreationTimeout) {
  constexpr int kRanks = 3, kVictim = 2;
  World w(
      kRanks, 500, [](Communicator&, int, Shared&) { ADD_FAILURE() << "created without rank 2"; },
      kVictim);
  w.join(15s, kVictim);
  for (int r = 0; r < kRanks; ++r) {
    if (r == kVictim) continue;
    const Outcome& o = w.shared().outcome[r];
    ASSERT_NE(o.failed_ns.load(), 0) << "rank " << r << " saw no error";
    const double took = static_cast<double>(o.failed_ns.load() - o.start_ns.load()) / 1e6;
    EXPECT_TRUE(names_victim(o, kVictim)) << "rank " << r << ": " << o.what;
    const double due =
        std::chrono::duration<double, std::milli>(kStoppedCreationTimeout).count() - 500;
    EXPECT_GE(took, due - 50) << "rank " << r << ": " << o.what;
    EXPECT_LT(took, due + 500) << "rank " << r << ": " << o.what;
    std::printf("rank %d: never-heard rank %d reported after %.0f ms: %s\n", r, kVictim, took,
                o.what);
  }
}

// A rank that creates its communicator three peer timeouts after the
// others (it connected, then was slow) is not reported: never-heard peers
// have the creation's time until its handshake ends. Then one allreduce,
// exact.
TEST(PeerDetection, SlowCreatorNotReported) {
  World w(
      3, 500,
      [](Communicator& comm, int me, Shared&) {
        int64_t v = me + 1;
        comm.allreduce(TensorView(&v, 1, DType::i64), ExecContext::host(), {})->wait();
        EXPECT_EQ(v, 6);
      },
      -1, 2);
  w.join(30s);
}

// Every rank of 4 stopped at once for twice the 500 ms peer timeout (as a
// paused virtual machine or a suspended host): on resume no rank reports
// another lost, and their allreduces go on exact.
TEST(PeerDetection, NoFalseReportAfterEveryRankPaused) {
  constexpr int kRanks = 4;
  World w(kRanks, 500, [](Communicator& comm, int me, Shared& s) {
    // Rank 0 ends the loop (element 0) 3 s after it began; an error fails
    // the rank.
    const int64_t n = comm.size();
    const auto end = Clock::now() + 3s;
    int64_t v[2] = {};
    for (int64_t it = 0;; ++it) {
      v[0] = me == 0 && Clock::now() >= end ? 1 : 0;
      v[1] = me * 1000 + it;
      comm.allreduce(TensorView(v, 2, DType::i64), ExecContext::host(), {})->wait();
      ASSERT_EQ(v[1], n * (n - 1) / 2 * 1000 + n * it) << "iteration " << it;
      if (it == 0) s.ready.fetch_add(1);
      if (v[0] != 0) break;
    }
  });
  ASSERT_TRUE(w.await_ready());
  std::this_thread::sleep_for(200ms);
  for (int r = 0; r < kRanks; ++r) w.signal(r, SIGSTOP);
  std::this_thread::sleep_for(1000ms);
  for (int r = 0; r < kRanks; ++r) w.signal(r, SIGCONT);
  w.join(30s);
}

// 4 ranks on 2 CPUs with a 500 ms peer timeout: allreduces, and every
// fourth one followed by 1.5 s of computation on every rank (no call into
// relaxcc): no rank is reported lost.
TEST(PeerDetection, NoFalseReportOnSharedCpusWithLongComputation) {
  World w(4, 500, [](Communicator& comm, int me, Shared& s) {
    cpu_set_t two;
    CPU_ZERO(&two);
    CPU_SET(0, &two);
    CPU_SET(1 % std::max(1U, std::thread::hardware_concurrency()), &two);
    ASSERT_EQ(sched_setaffinity(0, sizeof(two), &two), 0);
    std::vector<int64_t> v(4096);
    const int n = comm.size();
    for (int it = 0; it < 12; ++it) {
      for (size_t i = 0; i < v.size(); ++i) v[i] = me * 100000 + static_cast<int64_t>(i) + it;
      comm.allreduce(TensorView(v.data(), static_cast<int64_t>(v.size()), DType::i64),
                     ExecContext::host(), {})
          ->wait();
      for (size_t i = 0; i < v.size(); ++i)
        ASSERT_EQ(v[i], int64_t{n} * (n - 1) / 2 * 100000 + n * (static_cast<int64_t>(i) + it));
      if (it % 4 == 3) {
        // Busy computation: the engine thread competes for the same CPUs.
        volatile uint64_t x = 0;
        const auto end = Clock::now() + 1500ms;
        while (Clock::now() < end)
          for (int k = 0; k < 10000; ++k) x = x + static_cast<uint64_t>(k);
      }
    }
    comm.barrier()->wait();
    s.ready.fetch_add(1);
  });
  w.join(50s);
}

// Figures for docs (run by hand): the 8 B allreduce with heartbeats off
// (RELAXCC_PEER_TIMEOUT_MS=0) and at the default, alternating, on `ranks`
// forked ranks (RELAXCC_DETECT_RANKS, default 2).
//   peer_detection_test --gtest_also_run_disabled_tests --gtest_filter='*Cost*'
TEST(PeerDetection, DISABLED_HeartbeatCostOnSmallAllreduce) {
  const int ranks =
      static_cast<int>(std::clamp<int64_t>(Tunables::from_env().detect_ranks, 2, kMaxRanks));
  constexpr int kIterations = 2000000;  // about 2 s: several heartbeat periods
  for (int rep = 0; rep < trials(5); ++rep) {
    for (const int64_t peer_timeout_ms : {int64_t{0}, int64_t{2000}}) {
      World w(ranks, peer_timeout_ms, [](Communicator& comm, int me, Shared& s) {
        int64_t v = me;
        for (int i = 0; i < 2000; ++i)
          comm.allreduce(TensorView(&v, 1, DType::i64), ExecContext::host(), {})->wait();
        comm.barrier()->wait();
        const int64_t t0 = monotonic_ns();
        for (int i = 0; i < kIterations; ++i)
          comm.allreduce(TensorView(&v, 1, DType::i64), ExecContext::host(), {})->wait();
        s.outcome[me].op_ns.store((monotonic_ns() - t0) / kIterations);
        comm.barrier()->wait();
      });
      w.join(60s);
      int64_t sum = 0;
      for (int r = 0; r < ranks; ++r) sum += w.shared().outcome[r].op_ns.load();
      std::printf(
          "%d ranks, RELAXCC_PEER_TIMEOUT_MS=%-4lld 8 B allreduce: %.2f us (mean of ranks)\n",
          ranks, static_cast<long long>(peer_timeout_ms),
          static_cast<double>(sum) / ranks / 1000.0);
      std::fflush(stdout);
    }
  }
}

}  // namespace
}  // namespace relaxcc::ucx

int main(int argc, char** argv) {
  // One machine: without this UCX adds a lane over eth0 to its own address.
  setenv("UCX_NET_DEVICES", "lo", 0);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
