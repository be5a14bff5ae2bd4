// create_ucx_communicator without mpirun: processes this program starts
// itself (fork + exec of itself, as a launcher would) with torchrun-style
// variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), with ranks by
// arrival order (RELAXCC_RENDEZVOUS and WORLD_SIZE only), and every bad
// start: the store unreachable, a rank used twice, sizes that disagree, a
// peer that never arrives. Each child reports one line on its stdout:
//   ok <rank> <size> <elapsed ms>
//   error <kind> <elapsed ms>\n<message>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "child_processes.h"
#include "free_port.h"
#include "relaxcc/errors.h"
#include "relaxcc/exec_context.h"
#include "relaxcc/rendezvous.h"
#include "relaxcc/store.h"
#include "relaxcc/tensor.h"
#include "relaxcc/ucx_communicator.h"

extern char** environ;

namespace relaxcc {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using test::free_port;

int64_t elapsed_ms(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
}

// The child: a communicator from the environment, one allreduce whose
// result encodes every rank, one barrier.
int child_main() {
  const auto t0 = Clock::now();
  try {
    auto comm = create_ucx_communicator();
    const int n = comm->size(), me = comm->rank();
    std::vector<int64_t> v(1000);
    for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t{1} << me | static_cast<int64_t>(i) << 16;
    comm->allreduce(TensorView::host(v.data(), static_cast<int64_t>(v.size())), ExecContext::host())
        ->wait();
    for (size_t i = 0; i < v.size(); ++i) {
      const int64_t want = ((int64_t{1} << n) - 1) + n * (static_cast<int64_t>(i) << 16);
      if (v[i] != want) {
        std::printf("error WrongResult %ld\nelement %zu is %ld, expected %ld\n",
                    static_cast<long>(elapsed_ms(t0)), i, static_cast<long>(v[i]),
                    static_cast<long>(want));
        return 0;
      }
    }
    comm->barrier()->wait();
    std::printf("ok %d %d %ld\n", me, n, static_cast<long>(elapsed_ms(t0)));
  } catch (const Timeout& e) {
    std::printf("error Timeout %ld\n%s\n", static_cast<long>(elapsed_ms(t0)), e.what());
  } catch (const PeerMismatch& e) {
    std::printf("error PeerMismatch %ld\n%s\n", static_cast<long>(elapsed_ms(t0)), e.what());
  } catch (const std::exception& e) {
    std::printf("error Other %ld\n%s\n", static_cast<long>(elapsed_ms(t0)), e.what());
  }
  std::fflush(stdout);
  return 0;
}

int64_t monotonic_us() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000 + ts.tv_nsec / 1000;
}

// The engine thread's sleep on the worker's event fd: rank 0 submits an
// allreduce and does not wait for it (the engine thread runs it); rank 1
// joins 1 s later. Rank 0 reports the voluntary context switches of its
// process during that second and when (CLOCK_MONOTONIC, us) its allreduce
// completed; rank 1 when it submitted:
//   ok <rank> <size> <elapsed ms> <switches> <time us>
int idle_child_main() {
  const auto t0 = Clock::now();
  try {
    auto comm = create_ucx_communicator();
    const int me = comm->rank();
    std::vector<int32_t> v(256, me + 1);
    comm->barrier()->wait();
    int64_t switches = 0, at = 0;
    if (me == 0) {
      rusage before{}, after{};
      getrusage(RUSAGE_SELF, &before);
      auto work = comm->allreduce(TensorView::host(v.data(), 256), ExecContext::host());
      // This thread blocks on a pipe the completion callback writes: only the
      // engine thread runs.
      int fds[2];
      if (::pipe(fds) != 0) throw std::runtime_error("pipe");
      work->then([&at, fd = fds[1]](const Work&) {
        at = monotonic_us();
        const char c = 1;
        [[maybe_unused]] const ssize_t n = ::write(fd, &c, 1);
      });
      char c = 0;
      [[maybe_unused]] const ssize_t n = ::read(fds[0], &c, 1);
      getrusage(RUSAGE_SELF, &after);
      ::close(fds[0]);
      ::close(fds[1]);
      switches = after.ru_nvcsw - before.ru_nvcsw;
      work->wait();
    } else {
      ::usleep(1000000);
      at = monotonic_us();
      comm->allreduce(TensorView::host(v.data(), 256), ExecContext::host())->wait();
    }
    comm->barrier()->wait();
    if (v[0] != 3) throw std::runtime_error("wrong allreduce result");
    std::printf("ok %d %d %ld %ld %ld\n", me, comm->size(), static_cast<long>(elapsed_ms(t0)),
                static_cast<long>(switches), static_cast<long>(at));
  } catch (const std::exception& e) {
    std::printf("error Other %ld\n%s\n", static_cast<long>(elapsed_ms(t0)), e.what());
  }
  std::fflush(stdout);
  return 0;
}

// Threads of this process.
int64_t thread_count() {
  return std::distance(std::filesystem::directory_iterator("/proc/self/task"),
                       std::filesystem::directory_iterator());
}

// Two communicators on one store (rank 0 serves it at MASTER_PORT), the
// second on the first's engine and worker (share_engine_with), each on a
// generation of its own; allreduces on both at once, whose results encode
// the communicator, every rank and the index, checked exactly:
//   ok <rank> <size> <elapsed ms> <threads before the second> <threads after>
int share_child_main() {
  const auto t0 = Clock::now();
  try {
    const RendezvousOptions env = RendezvousOptions::from_env();
    TcpStoreOptions t;
    t.host = env.host;
    t.port = env.port;
    t.is_server = env.rank == 0;
    t.timeout = milliseconds(20000);
    auto store = std::make_shared<TcpStore>(t);
    UcxCommunicatorOptions o;
    o.store = store;
    o.rendezvous.rank = env.rank;
    o.rendezvous.size = env.size;
    o.rendezvous.job = "share";
    auto first = create_ucx_communicator(o);
    const int64_t before = thread_count();
    o.rendezvous.generation = 1;
    o.share_engine_with = first;
    auto second = create_ucx_communicator(o);
    const int64_t after = thread_count();
    const int n = first->size(), me = first->rank();
    std::vector<int64_t> v[2];
    WorkPtr works[2];
    for (int k = 0; k < 2; ++k) {
      v[k].resize(4096);
      for (size_t i = 0; i < v[k].size(); ++i)
        v[k][i] = (int64_t{1} << me) * (k + 1) + (static_cast<int64_t>(i) << 20);
      works[k] = (k == 0 ? first : second)
                     ->allreduce(TensorView::host(v[k].data(), static_cast<int64_t>(v[k].size())),
                                 ExecContext::host());
    }
    for (int k = 0; k < 2; ++k) {
      works[k]->wait();
      for (size_t i = 0; i < v[k].size(); ++i) {
        const int64_t want =
            ((int64_t{1} << n) - 1) * (k + 1) + n * (static_cast<int64_t>(i) << 20);
        if (v[k][i] != want)
          throw std::runtime_error("communicator " + std::to_string(k) + ", element " +
                                   std::to_string(i) + ": " + std::to_string(v[k][i]) +
                                   ", expected " + std::to_string(want));
      }
    }
    second->barrier()->wait();
    second.reset();
    first->barrier()->wait();
    first.reset();
    std::printf("ok %d %d %ld %ld %ld\n", me, n, static_cast<long>(elapsed_ms(t0)),
                static_cast<long>(before), static_cast<long>(after));
  } catch (const std::exception& e) {
    std::printf("error Other %ld\n%s\n", static_cast<long>(elapsed_ms(t0)), e.what());
  }
  std::fflush(stdout);
  return 0;
}

struct Child : test::ChildRun {
  bool ok = false;
  int rank = -1, size = 0;
  std::string kind, message;
  int64_t elapsed = 0;
  std::vector<int64_t> extra;  // what follows on an "ok" line
};

// Variables a child gets only from `vars`.
const std::vector<std::string> kControlled = {
    "RANK",       "WORLD_SIZE",         "MASTER_ADDR",          "MASTER_PORT",
    "LOCAL_RANK", "RELAXCC_RENDEZVOUS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "PMIX_RANK",  "SLURM_PROCID",       "SLURM_NTASKS",         "RELAXCC_TIMEOUT_MS"};

Child spawn(const std::map<std::string, std::string>& vars, const char* mode = "--ucx-child") {
  Child c;
  static_cast<test::ChildRun&>(c) = test::spawn_child(mode, vars, kControlled);
  return c;
}

// Reads every child's report (killing any still running after 30 s).
void collect(std::vector<Child>& children) {
  std::vector<test::ChildRun*> runs;
  for (auto& c : children) runs.push_back(&c);
  test::collect_children(runs, milliseconds(30000));
  for (auto& c : children) {
    EXPECT_TRUE(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)
        << "child " << c.pid << " status " << c.status << ": " << c.text;
    std::istringstream in(c.text);
    std::string head;
    in >> head;
    if (head == "ok") {
      in >> c.rank >> c.size >> c.elapsed;
      for (int64_t x; in >> x;) c.extra.push_back(x);
      c.ok = true;
    } else if (head == "error") {
      in >> c.kind >> c.elapsed;
      std::string line;
      std::getline(in, line);
      std::getline(in, c.message);
    } else {
      ADD_FAILURE() << "child " << c.pid << " reported: " << c.text;
    }
  }
}

std::map<std::string, std::string> torchrun(int rank, int size, uint16_t port,
                                            int64_t timeout_ms = 20000) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(size)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(port)},
          {"RELAXCC_TIMEOUT_MS", std::to_string(timeout_ms)}};
}

void expect_every_rank_once(const std::vector<Child>& children, int n) {
  std::vector<int> seen(static_cast<size_t>(n), 0);
  for (const auto& c : children) {
    ASSERT_TRUE(c.ok) << c.kind << ": " << c.message;
    EXPECT_EQ(c.size, n);
    ASSERT_GE(c.rank, 0);
    ASSERT_LT(c.rank, n);
    ++seen[static_cast<size_t>(c.rank)];
  }
  for (int r = 0; r < n; ++r) EXPECT_EQ(seen[static_cast<size_t>(r)], 1) << "rank " << r;
}

class TorchrunStyle : public testing::TestWithParam<int> {};

// RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: rank 0 serves the store; each
// rank gets the rank it was given and an exact allreduce over all of them.
TEST_P(TorchrunStyle, RanksFromTheEnvironment) {
  const int n = GetParam();
  const uint16_t port = free_port();
  std::vector<Child> children;
  // Rank 0 last: the others retry until it serves.
  for (int r = n - 1; r >= 0; --r) children.push_back(spawn(torchrun(r, n, port)));
  collect(children);
  expect_every_rank_once(children, n);
  for (size_t k = 0; k < children.size(); ++k)
    EXPECT_EQ(children[k].rank, n - 1 - static_cast<int>(k));
}
INSTANTIATE_TEST_SUITE_P(Ranks, TorchrunStyle, testing::Values(1, 2, 4));

// RELAXCC_RENDEZVOUS and WORLD_SIZE, no rank: the first process to bind the
// address serves the store and ranks come by arrival.
TEST(ArrivalOrder, EveryProcessGetsADistinctRank) {
  const int n = 3;
  const std::string address = "127.0.0.1:" + std::to_string(free_port());
  std::vector<Child> children;
  for (int k = 0; k < n; ++k)
    children.push_back(spawn({{"RELAXCC_RENDEZVOUS", address},
                              {"WORLD_SIZE", std::to_string(n)},
                              {"RELAXCC_TIMEOUT_MS", "20000"}}));
  collect(children);
  expect_every_rank_once(children, n);
}

constexpr int64_t kTimeoutMs = 2000;
// Slack for a loaded machine (the store's server lingers 0.5 s as well).
constexpr int64_t kSlackMs = 2500;

void expect_error(const Child& c, const std::string& kind, const std::string& names,
                  int64_t within_ms) {
  EXPECT_FALSE(c.ok) << "expected " << kind;
  EXPECT_EQ(c.kind, kind) << c.message;
  EXPECT_NE(c.message.find(names), std::string::npos)
      << "expected \"" << names << "\" in: " << c.message;
  EXPECT_LE(c.elapsed, within_ms) << c.message;
}

TEST(BadStart, StoreUnreachable) {
  const uint16_t port = free_port();
  std::vector<Child> children{spawn(torchrun(1, 2, port, kTimeoutMs))};
  collect(children);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  expect_error(children[0], "Timeout", address, kTimeoutMs + kSlackMs);
  EXPECT_GE(children[0].elapsed, kTimeoutMs - 100);
}

TEST(BadStart, RankUsedTwice) {
  const uint16_t port = free_port();
  std::vector<Child> children{spawn(torchrun(0, 3, port, kTimeoutMs)),
                              spawn(torchrun(1, 3, port, kTimeoutMs)),
                              spawn(torchrun(1, 3, port, kTimeoutMs))};
  collect(children);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  for (const auto& c : children) {
    expect_error(c, "PeerMismatch", address, kTimeoutMs + kSlackMs);
    EXPECT_NE(c.message.find("rank 1"), std::string::npos) << c.message;
  }
}

TEST(BadStart, SizesDisagree) {
  const uint16_t port = free_port();
  std::vector<Child> children{spawn(torchrun(0, 2, port, kTimeoutMs)),
                              spawn(torchrun(1, 3, port, kTimeoutMs))};
  collect(children);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  for (const auto& c : children) expect_error(c, "PeerMismatch", address, kTimeoutMs + kSlackMs);
}

TEST(BadStart, PeerNeverArrives) {
  const uint16_t port = free_port();
  std::vector<Child> children{spawn(torchrun(0, 3, port, kTimeoutMs)),
                              spawn(torchrun(1, 3, port, kTimeoutMs))};
  collect(children);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  for (const auto& c : children) {
    expect_error(c, "Timeout", address, kTimeoutMs + kSlackMs);
    EXPECT_NE(c.message.find("2"), std::string::npos) << "names the missing rank: " << c.message;
    EXPECT_GE(c.elapsed, kTimeoutMs - 100);
  }
}

// share_engine_with on the UCX wing: the second communicator runs on the
// first's engine (no thread more) and both reduce exactly at once.
TEST(ShareEngine, SecondCommunicatorOnTheFirstsEngine) {
  const uint16_t port = free_port();
  std::vector<Child> children{spawn(torchrun(0, 2, port), "--ucx-share-child"),
                              spawn(torchrun(1, 2, port), "--ucx-share-child")};
  collect(children);
  for (const auto& c : children) {
    ASSERT_TRUE(c.ok) << c.kind << ": " << c.message;
    ASSERT_EQ(c.extra.size(), 2u);
    EXPECT_EQ(c.extra[1], c.extra[0]) << "threads before and after the second communicator";
  }
}

// A tunable out of its range: InvalidArgument naming the variable, from the
// one check every communicator's tunables pass (check_tunables).
TEST(BadStart, TunableOutOfRange) {
  const uint16_t port = free_port();
  std::vector<Child> children;
  for (int r = 0; r < 2; ++r) {
    auto vars = torchrun(r, 2, port, kTimeoutMs);
    vars["RELAXCC_PEER_TIMEOUT_MS"] = "50";
    children.push_back(spawn(vars));
  }
  collect(children);
  for (const auto& c : children) expect_error(c, "Other", "RELAXCC_PEER_TIMEOUT_MS=50", kTimeoutMs);
}

// While it waits 1 s for its peer, rank 0's engine thread sleeps on the
// worker's event fd, waking every millisecond (for deadlines) instead of
// every RELAXCC_MAX_SLEEP_US (50 us): at most 1500 voluntary context
// switches in that second, where polling makes over 10000; and the peer's
// message wakes it at once (the allreduce completes within 20 ms of the
// peer's submission, with slack for a loaded machine).
TEST(EngineSleep, OnTheEventFdAndWakesForAMessage) {
  const uint16_t port = free_port();
  std::vector<Child> children{spawn(torchrun(1, 2, port), "--ucx-idle-child"),
                              spawn(torchrun(0, 2, port), "--ucx-idle-child")};
  collect(children);
  for (const auto& c : children) {
    ASSERT_TRUE(c.ok) << c.kind << ": " << c.message;
    ASSERT_EQ(c.extra.size(), 2u);
  }
  const Child& zero = children[1];
  const Child& one = children[0];
  EXPECT_LE(zero.extra[0], 1500) << "voluntary context switches while idle";
  EXPECT_LE(zero.extra[1] - one.extra[1], 20000) << "us from the peer's submission to completion";
  std::printf(
      "rank 0: %ld voluntary context switches, completed %ld us after the peer's submission\n",
      static_cast<long>(zero.extra[0]), static_cast<long>(zero.extra[1] - one.extra[1]));
}

// Options that do not parse or are missing: InvalidArgument at once.
TEST(BadStart, NoRendezvousAddress) {
  UcxCommunicatorOptions o;
  o.rendezvous = RendezvousOptions{};
  o.rendezvous.size = 2;
  EXPECT_THROW(create_ucx_communicator(o), InvalidArgument);
}

}  // namespace
}  // namespace relaxcc

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--ucx-child") == 0) return relaxcc::child_main();
  if (argc > 1 && std::strcmp(argv[1], "--ucx-idle-child") == 0) return relaxcc::idle_child_main();
  if (argc > 1 && std::strcmp(argv[1], "--ucx-share-child") == 0)
    return relaxcc::share_child_main();
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
