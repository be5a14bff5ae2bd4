// The fault suite: a rank that skips a collective, arrives late, never
// synchronizes or is killed; overlapping views; corrupted payloads. Each
// scenario asserts the typed error, the rank it names and the time it took:
// within the timeout plus kMargin where a timeout is the only way to know,
// within kAtOnce where a peer or the transport already knows.
//
// Every scenario runs on a communicator of its own, created from a
// duplicate of MPI_COMM_WORLD, so that what one scenario leaves parked (a
// timed-out MPI_Comm_idup, a poisoned communicator) cannot reach the next.
#include <mpi.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "relaxcc/algorithms/gradient_allreduce.h"
#include "relaxcc/errors.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/reducer.h"
#include "relaxcc/tunables.h"
#include "test_util.h"

namespace relaxcc {
namespace {

using test::Buffer;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// The operations' timeout in these scenarios.
constexpr auto kTimeout = 1000ms;
// Slack for a loaded CI machine (up to 4 ranks on 2 cores, suites side by side).
constexpr auto kMargin = 3000ms;
// "At once": well before any timeout could have expired.
constexpr auto kAtOnce = 800ms;

using test::world_rank;
using test::world_size;

// A duplicate of MPI_COMM_WORLD for one scenario. Freed by MPI when its last
// pending operation completes (a parked one may never).
MPI_Comm scenario_comm() {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  return c;
}

MpiCommunicatorOptions options(MPI_Comm c, std::chrono::milliseconds timeout = kTimeout) {
  MpiCommunicatorOptions o;
  o.comm = c;
  o.tunables.timeout_ms = timeout.count();
  o.timeout = timeout;
  return o;
}

// A communicator over every rank on the program's wing (test_util.h).
CommunicatorPtr create(const MpiCommunicatorOptions& o) {
  return test::create_communicator(o.tunables, o.timeout, o.comm);
}

struct Outcome {
  std::string what;
  Clock::duration elapsed{};
};

// Runs `fn`, which must throw E; returns its message and the time it took.
template <typename E>
Outcome expect_error(const std::function<void()>& fn) {
  const auto t0 = Clock::now();
  Outcome out;
  try {
    fn();
    ADD_FAILURE() << "rank " << world_rank() << ": no exception, expected " << typeid(E).name();
  } catch (const E& e) {
    out.what = e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "rank " << world_rank() << ": unexpected exception: " << e.what();
  }
  out.elapsed = Clock::now() - t0;
  return out;
}

#define EXPECT_WITHIN(outcome, lo, hi)                    \
  do {                                                    \
    EXPECT_GE((outcome).elapsed, (lo)) << (outcome).what; \
    EXPECT_LE((outcome).elapsed, (hi)) << (outcome).what; \
  } while (0)
#define EXPECT_NAMES(outcome, text)                       \
  EXPECT_NE((outcome).what.find(text), std::string::npos) \
      << "expected \"" << (text) << "\" in: " << (outcome).what

// ---- a rank that skips a collective ------------------------------------------

// Rank 0 calls allreduce(100) then allreduce(200); the others skip the first.
// The first pair mismatches on every rank at once; rank 0's second call has
// no partner, times out naming a peer, and its notice reaches the others.
TEST(SkipCollective, MismatchAtOnceThenTimeoutReachesEveryRank) {
  if (world_size() == 1) GTEST_SKIP() << "needs 2 or more ranks";
  auto comm = create(options(scenario_comm()));
  Buffer a(DType::f32, 100), b(DType::f32, 200);
  if (comm->rank() == 0) {
    const Outcome mismatch =
        expect_error<PeerMismatch>([&] { comm->allreduce(a.view(), ExecContext::host())->wait(); });
    EXPECT_WITHIN(mismatch, 0ms, kAtOnce);
    EXPECT_NAMES(mismatch, "rank 0 calls allreduce #");
    EXPECT_NAMES(mismatch, "of 100 x f32");
    const Outcome timeout =
        expect_error<Timeout>([&] { comm->allreduce(b.view(), ExecContext::host())->wait(); });
    EXPECT_WITHIN(timeout, kTimeout, kTimeout + kMargin);
    EXPECT_NAMES(timeout, "waiting for: rank ");
    EXPECT_NAMES(timeout, "(header)");
  } else {
    const Outcome mismatch =
        expect_error<PeerMismatch>([&] { comm->allreduce(b.view(), ExecContext::host())->wait(); });
    EXPECT_WITHIN(mismatch, 0ms, kAtOnce);
    EXPECT_NAMES(mismatch, "rank 0");
    // Rank 0 is now stuck in its second call; once it timed out, its notice
    // fails this rank's next call before it starts.
    std::this_thread::sleep_for(kTimeout + 500ms);
    const Outcome refused = expect_error<CommunicatorPoisoned>(
        [&] { comm->allreduce(b.view(), ExecContext::host())->wait(); });
    EXPECT_WITHIN(refused, 0ms, kAtOnce);
    EXPECT_NAMES(refused, "by rank 0: timeout of allreduce #");
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// ---- a rank that arrives after a peer timed out --------------------------------

// Rank 0 times out waiting for the others; they call later (small and large
// messages) and fail at once with CommunicatorPoisoned naming rank 0,
// instead of completing with rank 0's data or waiting their own timeout.
class LateRank : public testing::TestWithParam<int64_t> {};

TEST_P(LateRank, FailsAtOnceAfterPeerTimedOut) {
  if (world_size() == 1) GTEST_SKIP() << "needs 2 or more ranks";
  auto comm = create(options(scenario_comm()));
  Buffer data(DType::f32, GetParam());
  test::fill(data, comm->rank());
  if (comm->rank() == 0) {
    const Outcome timeout =
        expect_error<Timeout>([&] { comm->allreduce(data.view(), ExecContext::host())->wait(); });
    EXPECT_WITHIN(timeout, kTimeout, kTimeout + kMargin);
    EXPECT_NAMES(timeout, "waiting for: rank ");
  } else {
    std::this_thread::sleep_for(kTimeout + 500ms);
    const Outcome late = expect_error<CommunicatorPoisoned>(
        [&] { comm->allreduce(data.view(), ExecContext::host())->wait(kTimeout + kMargin); });
    EXPECT_WITHIN(late, 0ms, kAtOnce);
    EXPECT_NAMES(late, "by rank 0: timeout of allreduce #");
    const Outcome next = expect_error<CommunicatorPoisoned>([&] { comm->barrier(); });
    EXPECT_WITHIN(next, 0ms, kAtOnce);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

INSTANTIATE_TEST_SUITE_P(SmallAndLarge, LateRank, testing::Values(int64_t{64}, int64_t{1} << 18),
                         [](const auto& p) { return std::to_string(p.param * 4) + "_bytes"; });

// The same for a split: the peers' split fails at once.
TEST(LateSplit, FailsAtOnceAfterPeerTimedOut) {
  if (world_size() == 1) GTEST_SKIP() << "needs 2 or more ranks";
  auto comm = create(options(scenario_comm()));
  SplitOptions so;
  so.timeout = kTimeout;
  if (comm->rank() == 0) {
    const Outcome timeout = expect_error<Timeout>([&] { comm->split(0, 0, so); });
    EXPECT_WITHIN(timeout, kTimeout, kTimeout + kMargin);
  } else {
    std::this_thread::sleep_for(kTimeout + 500ms);
    const Outcome late =
        expect_error<CommunicatorPoisoned>([&] { comm->split(0, comm->rank(), so); });
    EXPECT_WITHIN(late, 0ms, kAtOnce);
    EXPECT_NAMES(late, "by rank 0");
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// ---- a rank that creates its communicator late ---------------------------------

// The last rank arrives after the others' creation timed out (Timeout, no job
// abort, no MPI error handler, no hang).
//   others_give_up: the late rank's creation gets Timeout too, within its
//     own timeout (the others never take part in its handshake).
//   others_retry: the retry waits for the same parked MPI_Comm_idup, which
//     the late rank completes: every rank gets a working communicator.
class LateCreate : public testing::TestWithParam<bool> {};

TEST_P(LateCreate, TimesOutCleanlyOrSucceedsOnRetry) {
  if (world_size() == 1) GTEST_SKIP() << "needs 2 or more ranks";
  RELAXCC_SKIP_ON_UCX(
      "MPI's parked MPI_Comm_idup (ucx_communicator_test has the UCX wing's late starts)");
  const bool others_retry = GetParam();
  MPI_Comm c = scenario_comm();
  const bool late = world_rank() == world_size() - 1;
  CommunicatorPtr comm;
  if (!late) {
    const Outcome first = expect_error<Timeout>([&] { create(options(c)); });
    EXPECT_WITHIN(first, kTimeout, kTimeout + kMargin);
    EXPECT_NAMES(first, "create_mpi_communicator");
    if (others_retry) comm = create(options(c, 3 * kTimeout));
  } else {
    std::this_thread::sleep_for(kTimeout + 500ms);
    if (others_retry) {
      comm = create(options(c, 3 * kTimeout));
    } else {
      const Outcome arrival = expect_error<Timeout>([&] { create(options(c, 2 * kTimeout)); });
      EXPECT_WITHIN(arrival, 2 * kTimeout, 2 * kTimeout + kMargin);
      EXPECT_NAMES(arrival, "create_mpi_communicator handshake");
    }
  }
  if (others_retry) {
    Buffer b(DType::i32, 100);
    test::fill(b, comm->rank());
    comm->allreduce(b.view(), ExecContext::host())->wait();
    for (int64_t i = 0; i < b.numel; ++i)
      ASSERT_EQ(b.as<int32_t>()[i],
                test::expected_reduction<int32_t>(i, ReduceOp::sum, world_size()));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

INSTANTIATE_TEST_SUITE_P(OthersGiveUpOrRetry, LateCreate, testing::Bool(),
                         [](const auto& p) { return p.param ? "others_retry" : "others_give_up"; });

// ---- a rank that never calls synchronize ------------------------------------------

// Every rank marks its gradients ready; rank 1 never calls synchronize().
// The others time out in synchronize() naming rank 1 and what the wait was
// for; rank 1 learns it from their notice.
TEST(NeverSynchronize, OthersTimeOutNamingTheRank) {
  if (world_size() == 1) GTEST_SKIP() << "needs 2 or more ranks";
  auto comm = create(options(scenario_comm()));
  Buffer g0(DType::f32, 1000), g1(DType::f32, 3000);
  std::vector<TensorSpec> specs{{"layer1.weight", g0.view()}, {"layer2.weight", g1.view()}};
  Tunables tunables;
  tunables.timeout_ms = kTimeout.count();
  Reducer reducer(comm, specs, std::make_shared<algorithms::GradientAllreduce>(),
                  ExecContext::host(), {}, tunables);
  reducer.begin_step();
  reducer.mark_ready(0);
  reducer.mark_ready(1);
  if (comm->rank() != 1) {
    // A rank other than 0 and 1 may learn of the failure from rank 0's
    // notice first: then it names rank 0, whose reason names rank 1.
    const Outcome out = expect_error<CommunicationError>([&] { reducer.synchronize(); });
    // Ranks enter synchronize() together; the first to time out may reach
    // the others just before their own timeout.
    EXPECT_WITHIN(out, kTimeout - 300ms, kTimeout + kMargin);
    EXPECT_NAMES(out, "rank 1");
  } else {
    // The Reducer's traffic runs on a group of `comm`: its notice poisons
    // that group, so a late synchronize() fails at once.
    std::this_thread::sleep_for(kTimeout + 500ms);
    const Outcome late = expect_error<CommunicatorPoisoned>([&] { reducer.synchronize(); });
    EXPECT_WITHIN(late, 0ms, kAtOnce);
    EXPECT_NAMES(late, "poisoned (by rank ");
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// ---- a rank killed mid-loop ----------------------------------------------------

// Registered as its own entry (fault_test.killed), under `mpirun
// --enable-recovery`, which keeps the job alive when a rank dies. Open MPI
// 4.1 then reports nothing about the dead rank through its API, so the
// survivors learn it from the timeout: the first to time out names the rank
// it waited for, and its notice fails the others at once. On the UCX wing
// (fault_test.ucx_killed) the transport sees the process end and every
// survivor fails at once with PeerLost naming it. Each survivor
// prints "survivor rank R: ok" and leaves with _exit, since MPI_Finalize
// after a rank died may hang (and mpirun --enable-recovery exits with 0
// whatever the ranks did: CTest reads the output instead).
TEST(Killed, RankKilledMidLoopIsNamed) {
  if (Tunables::from_env().fault_kill == 0)
    GTEST_SKIP()
        << "runs in its own entry, under mpirun --enable-recovery, with RELAXCC_FAULT_KILL=1";
  if (world_size() < 3) GTEST_SKIP() << "needs 3 or more ranks: two survivors";
  constexpr int kVictim = 1;
  constexpr int kKillStep = 5;
  auto comm = create(options(scenario_comm()));
  Buffer data(DType::i32, 1 << 16);
  Outcome failure;
  int lost_peer = -1;
  int step = 0;
  for (;; ++step) {
    if (comm->rank() == kVictim && step == kKillStep) raise(SIGKILL);
    test::fill(data, comm->rank(), step);
    const auto t0 = Clock::now();
    try {
      comm->allreduce(data.view(), ExecContext::host())->wait();
    } catch (const CommunicationError& e) {
      failure = {e.what(), Clock::now() - t0};
      if (const auto* lost = dynamic_cast<const PeerLost*>(&e)) lost_peer = lost->peer();
      break;
    }
    for (int64_t i = 0; i < data.numel; ++i)
      ASSERT_EQ(data.as<int32_t>()[i],
                test::expected_reduction<int32_t>(i + step, ReduceOp::sum, comm->size()));
  }
  EXPECT_EQ(step, kKillStep);
  EXPECT_WITHIN(failure, 0ms, kTimeout + kMargin);
  // The rank waited for, in Timeout or in the notice's reason, or the lost
  // rank (a transport that sees the process end: UCX).
  const bool named = failure.what.find("rank 1 (") != std::string::npos ||
                     failure.what.find("rank 1 is lost") != std::string::npos ||
                     failure.what.find("rank 1 lost") != std::string::npos;
  EXPECT_TRUE(named) << failure.what;
  // Timeout (MPI: kTimeout comes before RELAXCC_PEER_TIMEOUT_MS's default),
  // or PeerLost (UCX at once; a heartbeat's verdict should the timeout come
  // late), or the abort record of a survivor that failed first
  // (CommunicationError: "rank 2 failed: ... rank 1 is lost").
  const bool typed = failure.what.find("relaxcc::Timeout") != std::string::npos ||
                     failure.what.find("relaxcc::CommunicatorPoisoned") != std::string::npos ||
                     failure.what.find("relaxcc::PeerLost") != std::string::npos ||
                     failure.what.find("relaxcc::CommunicationError") != std::string::npos;
  EXPECT_TRUE(typed) << failure.what;
  // UCX sees the process end: PeerLost naming it on every survivor.
  if (test::on_ucx()) {
    EXPECT_EQ(lost_peer, kVictim) << failure.what;
  }
  std::printf("[rank %d] %s\n", comm->rank(), failure.what.c_str());
  if (!HasFailure()) std::printf("survivor rank %d: ok\n", comm->rank());
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(HasFailure() ? 1 : 0);
}

// Rank 1 stops itself (SIGSTOP) at the start of step 5 of an allreduce
// loop, under mpirun --enable-recovery with RELAXCC_PEER_TIMEOUT_MS=500 and
// an operation timeout of 10 s: the survivors' heartbeats find it silent and
// every survivor fails with PeerLost naming rank 1 (its own verdict, or a
// peer's notice or abort record), within 500 + 300 ms of its last completed
// allreduce (which precedes the stop). A child of the stopped rank kills it
// 3 s later, so that mpirun ends; survivors leave with _exit, as above.
TEST(Stopped, RankStoppedMidLoopIsReportedByHeartbeats) {
  if (Tunables::from_env().fault_stop == 0)
    GTEST_SKIP() << "runs in its own entry, under mpirun --enable-recovery, with "
                    "RELAXCC_FAULT_STOP=1 and RELAXCC_PEER_TIMEOUT_MS=500";
  if (world_size() < 3) GTEST_SKIP() << "needs 3 or more ranks: two survivors";
  constexpr int kVictim = 1;
  constexpr int kStopStep = 5;
  auto o = options(scenario_comm(), 10s);
  ASSERT_EQ(o.tunables.peer_timeout_ms, 500) << "set RELAXCC_PEER_TIMEOUT_MS=500";
  auto comm = create(o);
  Buffer data(DType::i32, 1 << 10);
  std::string failure;
  int lost_peer = -1;
  auto last_success = Clock::now();
  int step = 0;
  for (;; ++step) {
    if (comm->rank() == kVictim && step == kStopStep) {
      const pid_t self = getpid();
      if (fork() == 0) {
        std::this_thread::sleep_for(3s);
        kill(self, SIGKILL);
        _exit(0);
      }
      raise(SIGSTOP);
    }
    test::fill(data, comm->rank(), step);
    try {
      comm->allreduce(data.view(), ExecContext::host())->wait();
    } catch (const CommunicationError& e) {
      failure = e.what();
      if (const auto* lost = dynamic_cast<const PeerLost*>(&e)) lost_peer = lost->peer();
      break;
    }
    last_success = Clock::now();
    for (int64_t i = 0; i < data.numel; ++i)
      ASSERT_EQ(data.as<int32_t>()[i],
                test::expected_reduction<int32_t>(i + step, ReduceOp::sum, comm->size()));
  }
  const auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - last_success);
  EXPECT_EQ(step, kStopStep);
  EXPECT_LT(took, 800ms) << failure;
  // The heartbeat's verdict on rank 1, in the engine's words or the
  // transport's (UCX fails the requests to it: "UCX: rank 1 lost: ...").
  const bool named = failure.find("no heartbeat") != std::string::npos &&
                     (failure.find("rank 1 is lost") != std::string::npos ||
                      failure.find("rank 1 lost") != std::string::npos);
  EXPECT_TRUE(named) << failure;
  EXPECT_EQ(lost_peer, kVictim) << "PeerLost naming rank 1 on every survivor: " << failure;
  std::printf("[rank %d] after %lld ms: %s\n", comm->rank(), static_cast<long long>(took.count()),
              failure.c_str());
  if (!HasFailure()) std::printf("survivor rank %d: ok\n", comm->rank());
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(HasFailure() ? 1 : 0);
}

// ---- overlapping views ------------------------------------------------------------

// Every collective rejects an output that overlaps its input (other than its
// in-place form) with InvalidArgument at the call, on every rank, before
// anything is sent: the communicator stays usable. (broadcast works in
// place: it has one view.)
TEST(OverlappingViews, EveryCollectiveRejectsThem) {
  auto comm = create(options(scenario_comm()));
  const int n = comm->size();
  const int64_t m = 64;  // elements per rank
  Buffer buf(DType::f32, 4 * m * n);
  auto at = [&](int64_t offset, int64_t count) { return buf.view().slice(offset, count); };
  const ExecContext& host = ExecContext::host();
  struct Case {
    const char* name;     // the call
    const char* in_text;  // the op its message names (v forms share it)
    std::function<void()> call;
  };
  const std::vector<Case> cases{
      {"allreduce", "allreduce", [&] { comm->allreduce(at(0, m), at(m / 2, m), host); }},
      {"reduce_scatter", "reduce_scatter",
       [&] { comm->reduce_scatter(at(0, m * n), at(m * n / 2, m), host); }},
      {"allgather", "allgather", [&] { comm->allgather(at(1, m), at(0, m * n), host); }},
      {"allgatherv", "allgather",
       [&] {
         comm->allgatherv(at(1, m), at(0, m * n), std::vector<int64_t>(static_cast<size_t>(n), m),
                          host);
       }},
      {"alltoall", "alltoall", [&] { comm->alltoall(at(0, m * n), at(10, m * n), host); }},
      {"alltoallv", "alltoall",
       [&] {
         const std::vector<int64_t> counts(static_cast<size_t>(n), m);
         comm->alltoallv(at(0, m * n), counts, at(m, m * n), counts, host);
       }},
      {"point_to_point", "point_to_point",
       [&] {
         comm->point_to_point({P2POp::recv((comm->rank() + 1) % n, at(0, m), 7),
                               P2POp::recv((comm->rank() + n - 1) % n, at(m / 2, m), 8)},
                              host);
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Outcome out = expect_error<InvalidArgument>(c.call);
    EXPECT_WITHIN(out, 0ms, kAtOnce);
    EXPECT_NAMES(out, c.in_text);
    EXPECT_NAMES(out, "overlap");
  }
  EXPECT_FALSE(comm->poisoned());
  test::fill(buf, comm->rank());
  comm->allreduce(at(0, m), host)->wait();
  for (int64_t i = 0; i < m; ++i)
    ASSERT_EQ(buf.as<float>()[i], test::expected_reduction<float>(i, ReduceOp::sum, n));
}

// ---- corrupted payloads ------------------------------------------------------------

// Every codec: a truncated payload, a damaged header and random bit flips in
// the body give CorruptPayload at once, or (bit flips that keep the payload
// valid) finite values; never a crash, a non-finite value or a hang.
TEST(CorruptPayloads, EveryCodec) {
  using namespace kernels;
  const int64_t n = 4096;
  std::vector<float> x(n);
  std::mt19937 gen(1234 + world_rank());
  std::normal_distribution<float> normal(0.f, 3.f);
  for (float& v : x) v = normal(gen);
  std::vector<CompressorConfig> configs;
  for (int bits : {8, 4, 2, 1}) configs.push_back({.kind = CompressorKind::minmax, .bits = bits});
  configs.push_back({.kind = CompressorKind::f16});
  configs.push_back({.kind = CompressorKind::bf16});
  configs.push_back({.kind = CompressorKind::sign});
  configs.push_back({.kind = CompressorKind::topk, .ratio = 0.05});
  configs.push_back({.kind = CompressorKind::randomk, .ratio = 0.05});
  configs.push_back({.kind = CompressorKind::cocktail, .bits = 4, .chunk = 128, .ratio = 0.1});
  const ExecContext& host = ExecContext::host();
  std::vector<float> out(n);
  const TensorView out_view = TensorView::host(out.data(), n);
  for (const CompressorConfig& config : configs) {
    SCOPED_TRACE(compressor_name(config.kind) + std::string(" bits=") +
                 std::to_string(config.bits));
    std::vector<std::byte> payload(encoded_size(n, config));
    payload.resize(encode(TensorView::host(x.data(), n), payload, config, host));
    const auto decode_of = [&](std::vector<std::byte> bytes) {
      return [&out_view, &host, bytes = std::move(bytes)] { decode(bytes, out_view, host); };
    };
    // Truncated by one byte, and cut to half the header.
    for (size_t cut : {payload.size() - 1, sizeof(PayloadHeader) / 2}) {
      const Outcome o = expect_error<CorruptPayload>(decode_of(
          std::vector<std::byte>(payload.begin(), payload.begin() + static_cast<ptrdiff_t>(cut))));
      EXPECT_WITHIN(o, 0ms, kAtOnce);
    }
    // A damaged magic number and a damaged element count.
    for (size_t at : {size_t{0}, offsetof(PayloadHeader, n)}) {
      std::vector<std::byte> bad = payload;
      bad[at] ^= std::byte{0x5a};
      const Outcome o = expect_error<CorruptPayload>(decode_of(bad));
      EXPECT_WITHIN(o, 0ms, kAtOnce);
    }
    // Random bit flips anywhere after the header.
    std::uniform_int_distribution<size_t> where(sizeof(PayloadHeader), payload.size() - 1);
    int rejected = 0;
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<std::byte> bad = payload;
      for (int f = 0; f < 3; ++f)
        bad[where(gen)] ^= std::byte{static_cast<unsigned char>(1u << (gen() % 8))};
      try {
        decode(bad, out_view, host);
        for (int64_t i = 0; i < n; ++i)
          ASSERT_TRUE(std::isfinite(out[i])) << "element " << i << " = " << out[i];
      } catch (const CorruptPayload&) {
        ++rejected;
      }
    }
    RecordProperty(compressor_name(config.kind), rejected);
  }
}

}  // namespace
}  // namespace relaxcc
