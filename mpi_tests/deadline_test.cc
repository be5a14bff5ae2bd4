// Point-to-point rounds and deadlines (relaxcc/collectives/point_to_point.h):
// partial results that do not poison, late messages recognised by their
// round and dropped, never applied to another round, and bounded state.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "relaxcc/errors.h"
#include "relaxcc/mpi_communicator.h"
#include "relaxcc/tunables.h"
#include "test_util.h"

namespace relaxcc {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::Buffer;

constexpr int32_t kUntouched = -1;

// Element i of what `rank` sends in `round`: encodes sender, round and index.
int32_t value(int rank, uint64_t round, int64_t i) {
  return static_cast<int32_t>(rank * 10000000 + static_cast<int64_t>(round) * 1000 + i % 1000);
}

void fill_round(Buffer& b, int rank, uint64_t round) {
  for (int64_t i = 0; i < b.numel; ++i) b.as<int32_t>()[i] = value(rank, round, i);
}

void fill_untouched(Buffer& b) {
  for (int64_t i = 0; i < b.numel; ++i) b.as<int32_t>()[i] = kUntouched;
}

// Elements of `b` that differ from value(rank, round, i) (want_untouched:
// from kUntouched).
int64_t count_wrong(Buffer& b, int rank, uint64_t round, bool want_untouched = false) {
  int64_t wrong = 0;
  for (int64_t i = 0; i < b.numel; ++i)
    wrong += b.as<int32_t>()[i] != (want_untouched ? kUntouched : value(rank, round, i));
  return wrong;
}

// Waits (at most `limit`) until `done` holds.
template <typename Pred>
bool eventually(Pred done, std::chrono::milliseconds limit) {
  const auto until = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST(Rounds, NeighbourExchangeDeliversEachRoundExactly) {
  auto comm = test::world();
  const int n = comm->size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  const int me = comm->rank();
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  for (uint64_t round = 1; round <= 40; ++round) {
    Buffer out(DType::i32, 777), from_left(DType::i32, 777), from_right(DType::i32, 777);
    fill_round(out, me, round);
    P2POptions options;
    options.round = round;
    // Tag 0 carries messages rightwards, tag 1 leftwards.
    auto work = comm->point_to_point(
        {P2POp::send(right, out.view(), 0), P2POp::send(left, out.view(), 1),
         P2POp::recv(left, from_left.view(), 0), P2POp::recv(right, from_right.view(), 1)},
        ExecContext::host(), options);
    work->wait(30s);
    EXPECT_FALSE(work->partial());
    EXPECT_EQ(work->contributors(), (std::vector<int>{left, right}));
    ASSERT_EQ(count_wrong(from_left, left, round), 0) << "round " << round;
    ASSERT_EQ(count_wrong(from_right, right, round), 0) << "round " << round;
  }
}

// Round sends throttled behind a higher-priority allreduce (that waits for a
// late rank): two batches to the same peer and tag, each message in parts
// across nodes (deadline_test.parts), arrive whole and in their rounds; no
// part is sent from a released buffer, and parts of the two never mix.
TEST(Rounds, ThrottledMessagesInPartsStayWhole) {
  const int n = test::world_size();
  if (n < 2 || n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  auto comm = create_mpi_communicator();
  const int me = comm->rank();
  const int partner = (me + n / 2) % n;  // on the other emulated node
  constexpr int64_t kCount = 20000;      // 80 KB: five parts of 16 KiB
  for (int rep = 0; rep < 3; ++rep) {
    if (me == 0) std::this_thread::sleep_for(100ms);
    Buffer big(DType::f32, 1 << 20);
    AllreduceOptions urgent;
    urgent.priority = 10;
    WorkPtr allreduce = comm->allreduce(big.view(), ExecContext::host(), urgent);
    std::vector<Buffer> out, in;
    std::vector<WorkPtr> works;
    for (uint64_t k = 0; k < 2; ++k) {
      const uint64_t round = 1 + 2 * static_cast<uint64_t>(rep) + k;
      out.emplace_back(DType::i32, kCount);
      in.emplace_back(DType::i32, kCount);
      fill_round(out.back(), me, round);
      fill_untouched(in.back());
    }
    for (uint64_t k = 0; k < 2; ++k) {
      P2POptions options;
      options.round = 1 + 2 * static_cast<uint64_t>(rep) + k;
      works.push_back(comm->point_to_point(
          {P2POp::send(partner, out[k].view(), 0), P2POp::recv(partner, in[k].view(), 0)},
          ExecContext::host(), options));
    }
    allreduce->wait(30s);
    for (uint64_t k = 0; k < 2; ++k) {
      works[k]->wait(30s);
      EXPECT_FALSE(works[k]->partial());
      ASSERT_EQ(count_wrong(in[k], partner, 1 + 2 * static_cast<uint64_t>(rep) + k), 0)
          << "repetition " << rep << ", batch " << k;
    }
  }
  EXPECT_EQ(comm->stats().late_messages, 0u);
}

// A rank that sleeps past its neighbours' deadline every third round, over
// many rounds: every value a receive reports is the sender's value of that
// round; a receive reported missing left its tensor untouched; every message
// sent is either received in its round or dropped as late (none is lost or
// applied twice); requests stay bounded and drain; the communicator stays
// usable.
TEST(Deadlines, SlowRankOverManyRounds) {
  const int n = test::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  auto comm = create_mpi_communicator();  // its own statistics
  const int me = comm->rank();
  const int slow = n - 1;
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  constexpr uint64_t kRounds = 60;
  constexpr int64_t kCount = 20000;  // 80 KB: past the eager limit
  int64_t arrived = 0, partial_rounds = 0;
  int64_t max_pending = 0;
  for (uint64_t round = 1; round <= kRounds; ++round) {
    if (me == slow && round % 3 == 0) std::this_thread::sleep_for(60ms);
    Buffer out(DType::i32, kCount), from_left(DType::i32, kCount), from_right(DType::i32, kCount);
    fill_round(out, me, round);
    fill_untouched(from_left);
    fill_untouched(from_right);
    P2POptions options;
    options.round = round;
    options.deadline = Clock::now() + 20ms;
    auto work = comm->point_to_point(
        {P2POp::send(right, out.view(), 0), P2POp::send(left, out.view(), 1),
         P2POp::recv(left, from_left.view(), 0), P2POp::recv(right, from_right.view(), 1)},
        ExecContext::host(), options);
    work->wait(30s);  // completes by the deadline: never a timeout
    const std::vector<int> got = work->contributors();
    ASSERT_EQ(got.size() + work->missing_peers().size(), 2u);
    // Each tensor holds its sender's value of this round, or is untouched.
    size_t complete = 0;
    for (auto [tensor, peer] : {std::pair{&from_left, left}, std::pair{&from_right, right}}) {
      const bool received = count_wrong(*tensor, peer, round) == 0;
      ASSERT_TRUE(received || count_wrong(*tensor, peer, round, true) == 0)
          << "round " << round << ": the receive from rank " << peer
          << " holds neither its value of this round nor nothing";
      complete += received ? 1 : 0;
    }
    ASSERT_EQ(complete, got.size()) << "round " << round;
    arrived += static_cast<int64_t>(got.size());
    partial_rounds += work->partial() ? 1 : 0;
    max_pending = std::max(max_pending, comm->stats().requests_pending);
  }
  // A last round without a deadline drains what is late and completes.
  Buffer out(DType::i32, kCount), from_left(DType::i32, kCount), from_right(DType::i32, kCount);
  fill_round(out, me, kRounds + 1);
  P2POptions last;
  last.round = kRounds + 1;
  comm->point_to_point(
          {P2POp::send(right, out.view(), 0), P2POp::send(left, out.view(), 1),
           P2POp::recv(left, from_left.view(), 0), P2POp::recv(right, from_right.view(), 1)},
          ExecContext::host(), last)
      ->wait(30s);
  EXPECT_EQ(count_wrong(from_left, left, kRounds + 1), 0);
  EXPECT_EQ(count_wrong(from_right, right, kRounds + 1), 0);
  arrived += 2;
  comm->barrier()->wait(30s);
  // Every send completed: nothing parked.
  EXPECT_TRUE(eventually([&] { return comm->stats().requests_pending == 0; }, 5000ms))
      << comm->stats().requests_pending << " requests still pending";
  const CommStats stats = comm->stats();
  std::printf(
      "rank %d: %lld receives arrived, %llu late messages dropped, %lld partial rounds, at most "
      "%lld requests pending\n",
      me, static_cast<long long>(arrived), static_cast<unsigned long long>(stats.late_messages),
      static_cast<long long>(partial_rounds), static_cast<long long>(max_pending));
  // Conservation: 2 messages came in per round.
  EXPECT_EQ(arrived + static_cast<int64_t>(stats.late_messages), 2 * int64_t(kRounds + 1))
      << "arrived " << arrived << ", late " << stats.late_messages;
  // Bounded: at most this round's 4 messages and the last round's late ones,
  // each in parts across nodes (RELAXCC_ROUND_PART_BYTES).
  const int64_t part = std::max<int64_t>(Tunables::from_env().round_part_bytes, 1);
  const int64_t parts = (kCount * 4 + part - 1) / part;
  EXPECT_LE(max_pending, 16 * parts);
  if (me == (slow + n - 1) % n || me == (slow + 1) % n) {
    EXPECT_GE(partial_rounds, 5) << "the slow rank's neighbours must miss its late rounds";
    EXPECT_GE(stats.late_messages, 5u);
  }
  EXPECT_FALSE(comm->poisoned());
}

// The receiver gave up and never receives on that stream again: its sweeper
// takes the late message (1 MiB: a rendezvous send, which completes only when
// received), so the sender's send completes instead of staying parked.
TEST(Deadlines, SweeperCompletesTheSendOfAPeerThatGaveUp) {
  const int n = test::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  auto comm = create_mpi_communicator();
  const int me = comm->rank();
  Buffer data(DType::i32, 1 << 18);
  P2POptions options;
  options.round = 1;
  if (me == 0) {
    fill_untouched(data);
    options.deadline = Clock::now() + 5ms;
    auto work =
        comm->point_to_point({P2POp::recv(1, data.view(), 7)}, ExecContext::host(), options);
    work->wait(30s);
    EXPECT_TRUE(work->partial());
    EXPECT_EQ(work->missing_peers(), std::vector<int>{1});
    EXPECT_EQ(count_wrong(data, 1, 1, true), 0) << "an abandoned receive writes nothing";
  } else if (me == 1) {
    std::this_thread::sleep_for(100ms);
    fill_round(data, me, 1);
    auto work =
        comm->point_to_point({P2POp::send(0, data.view(), 7)}, ExecContext::host(), options);
    work->wait(30s);  // completes: rank 0's sweeper received it
    EXPECT_FALSE(work->partial());
  }
  comm->barrier()->wait(30s);
  if (me == 0) {
    EXPECT_TRUE(eventually([&] { return comm->stats().late_messages == 1; }, 5000ms));
    EXPECT_EQ(count_wrong(data, 1, 1, true), 0) << "the late message was dropped, not applied";
  }
  EXPECT_TRUE(eventually([&] { return comm->stats().requests_pending == 0; }, 5000ms));
}

// keep_late: a receive abandoned at its deadline leaves its message (small,
// or large enough for a rendezvous), sent after the deadline, for the next
// receive of the same round, which takes it exactly; nothing is counted
// late, and nothing stays pending.
TEST(Deadlines, KeepLateLeavesTheMessageForTheNextReceiveOfItsRound) {
  const int n = test::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  auto comm = create_mpi_communicator();
  const int me = comm->rank();
  for (const int64_t count : {int64_t{100}, int64_t{1} << 20}) {
    Buffer data(DType::i32, count);
    P2POptions options;
    options.round = 1;
    options.keep_late = true;
    if (me == 0) {
      fill_untouched(data);
      options.deadline = Clock::now() + 5ms;
      auto work =
          comm->point_to_point({P2POp::recv(1, data.view(), 9)}, ExecContext::host(), options);
      work->wait(30s);
      EXPECT_EQ(work->missing_peers(), std::vector<int>{1}) << count;
      EXPECT_EQ(count_wrong(data, 1, 1, true), 0) << "an abandoned receive writes nothing";
      std::this_thread::sleep_for(200ms);  // the message comes meanwhile
      options.deadline = Clock::now() + 10s;
      work = comm->point_to_point({P2POp::recv(1, data.view(), 9)}, ExecContext::host(), options);
      work->wait(30s);
      EXPECT_EQ(work->contributors(), std::vector<int>{1}) << count;
      EXPECT_EQ(count_wrong(data, 1, 1), 0) << count;
    } else if (me == 1) {
      std::this_thread::sleep_for(100ms);
      fill_round(data, me, 1);
      options.deadline = Clock::now() + 1ms;
      auto work =
          comm->point_to_point({P2POp::send(0, data.view(), 9)}, ExecContext::host(), options);
      work->wait(30s);
    }
    comm->barrier()->wait(30s);
  }
  EXPECT_EQ(comm->stats().late_messages, 0u);
  EXPECT_TRUE(eventually([&] { return comm->stats().requests_pending == 0; }, 5000ms));
  P2POptions bad;
  bad.round = 1;
  bad.keep_late = true;
  Buffer one(DType::i32, 1);
  EXPECT_THROW(
      comm->point_to_point({P2POp::recv((me + 1) % n, one.view(), 9)}, ExecContext::host(), bad),
      InvalidArgument)
      << "keep_late needs a deadline";
}

// A sender that skips a round: the receive of that round is missing at once
// (no wait for the deadline), and the message of the next round is kept for
// the receive of that round.
TEST(Rounds, SkippedRoundIsMissingAndTheNextOneIsKept) {
  const int n = test::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  auto comm = test::world();
  const int me = comm->rank();
  if (me == 1) {
    Buffer out(DType::i32, 100);
    fill_round(out, me, 2);
    P2POptions options;
    options.round = 2;
    comm->point_to_point({P2POp::send(0, out.view(), 4)}, ExecContext::host(), options)->wait(30s);
  } else if (me == 0) {
    Buffer first(DType::i32, 100), second(DType::i32, 100);
    fill_untouched(first);
    P2POptions options;
    options.round = 1;
    options.deadline = Clock::now() + 20s;
    auto work =
        comm->point_to_point({P2POp::recv(1, first.view(), 4)}, ExecContext::host(), options);
    work->wait(30s);
    EXPECT_TRUE(Clock::now() < *options.deadline)
        << "a skipped round must not wait for its deadline";
    EXPECT_EQ(work->missing_peers(), std::vector<int>{1});
    EXPECT_EQ(count_wrong(first, 1, 1, true), 0);
    options.round = 2;
    work = comm->point_to_point({P2POp::recv(1, second.view(), 4)}, ExecContext::host(), options);
    work->wait(30s);
    EXPECT_EQ(work->contributors(), std::vector<int>{1});
    EXPECT_EQ(count_wrong(second, 1, 2), 0);
  }
  comm->barrier()->wait(30s);
}

TEST(Rounds, DifferentCountIsPeerMismatchAndTheCommunicatorStaysUsable) {
  const int n = test::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  auto comm = test::world();
  const int me = comm->rank();
  P2POptions options;
  options.round = 9;
  options.deadline = Clock::now() + 20s;
  if (me == 1) {
    Buffer out(DType::i32, 12);
    fill_round(out, me, 9);
    comm->point_to_point({P2POp::send(0, out.view(), 6)}, ExecContext::host(), options)->wait(30s);
  } else if (me == 0) {
    Buffer in(DType::i32, 10);
    fill_untouched(in);
    auto work = comm->point_to_point({P2POp::recv(1, in.view(), 6)}, ExecContext::host(), options);
    try {
      work->wait(30s);
      ADD_FAILURE() << "expected PeerMismatch";
    } catch (const PeerMismatch& e) {
      EXPECT_NE(std::string(e.what()).find("expected 10 elements of i32, the sender sent 12"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(count_wrong(in, 1, 9, true), 0);
  }
  EXPECT_FALSE(comm->poisoned());
  comm->barrier()->wait(30s);
}

// started_deadline: a batch one of whose messages came by the deadline
// waits for the rest; one with nothing by then is abandoned at the deadline.
TEST(Deadlines, AStartedBatchGetsTheLaterDeadline) {
  const int n = test::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  auto comm = test::world();
  const int me = comm->rank();
  comm->barrier()->wait(30s);
  if (me == 1) {
    P2POptions options;
    options.round = 1;
    Buffer first(DType::i32, 8), rest(DType::i32, 5000), late(DType::i32, 8);
    fill_round(first, me, 1);
    fill_round(rest, me, 1);
    fill_round(late, me, 1);
    auto sent =
        comm->point_to_point({P2POp::send(0, first.view(), 7), P2POp::send(0, first.view(), 11)},
                             ExecContext::host(), options);
    std::this_thread::sleep_for(400ms);
    auto rest_sent =
        comm->point_to_point({P2POp::send(0, rest.view(), 8), P2POp::send(0, late.view(), 9),
                              P2POp::send(0, rest.view(), 10)},
                             ExecContext::host(), options);
    sent->wait(30s);
    rest_sent->wait(30s);
  } else if (me == 0) {
    Buffer first(DType::i32, 8), rest(DType::i32, 5000), late(DType::i32, 8),
        late_rest(DType::i32, 5000);
    fill_untouched(late);
    fill_untouched(late_rest);
    P2POptions options;
    options.round = 1;
    const auto start = Clock::now();
    options.deadline = start + 150ms;
    options.started_deadline = start + 20s;
    auto begun =
        comm->point_to_point({P2POp::recv(1, first.view(), 7), P2POp::recv(1, rest.view(), 8)},
                             ExecContext::host(), options);
    auto silent =
        comm->point_to_point({P2POp::recv(1, late.view(), 9), P2POp::recv(1, late_rest.view(), 10)},
                             ExecContext::host(), options);
    silent->wait(30s);
    EXPECT_LT(Clock::now() - start, 390ms) << "nothing came by the deadline: no later one";
    EXPECT_EQ(silent->missing_peers(), (std::vector<int>{1, 1}));  // per receive
    EXPECT_EQ(count_wrong(late, 1, 1, true), 0);
    EXPECT_EQ(count_wrong(late_rest, 1, 1, true), 0);
    begun->wait(30s);
    EXPECT_GE(Clock::now() - start, 300ms) << "the rest was sent 400 ms after the first";
    EXPECT_FALSE(begun->partial());
    EXPECT_EQ(begun->contributors(), (std::vector<int>{1, 1}));
    EXPECT_EQ(count_wrong(first, 1, 1), 0);
    EXPECT_EQ(count_wrong(rest, 1, 1), 0);
    // Begun (its first message was sent with `first`), but the rest never
    // comes: abandoned at started_deadline.
    Buffer head(DType::i32, 8), never(DType::i32, 8);
    fill_untouched(never);
    P2POptions capped = options;
    const auto posted = Clock::now();
    capped.deadline = posted + 300ms;
    capped.started_deadline = posted + 1000ms;
    auto cut =
        comm->point_to_point({P2POp::recv(1, head.view(), 11), P2POp::recv(1, never.view(), 12)},
                             ExecContext::host(), capped);
    cut->wait(30s);
    EXPECT_GE(Clock::now() - posted, 900ms) << "its first message came: the later deadline";
    EXPECT_LT(Clock::now() - posted, 15s);
    EXPECT_TRUE(cut->partial());
    EXPECT_EQ(cut->contributors(), (std::vector<int>{1}));
    EXPECT_EQ(cut->missing_peers(), (std::vector<int>{1}));
    EXPECT_EQ(count_wrong(head, 1, 1), 0);
    EXPECT_EQ(count_wrong(never, 1, 1, true), 0);
  }
  EXPECT_FALSE(comm->poisoned());
  comm->barrier()->wait(30s);
}

// A send batch whose deadline passes while its sends are held back behind a
// higher-priority operation: a peer that was sent one of its messages gets
// the rest (its receive batch would wait for them), and the Work still
// completes at its deadline.
TEST(Deadlines, HeldBackSendsGoWhereTheBatchBegan) {
  const int n = test::world_size();
  if (n != 2) GTEST_SKIP() << "needs 2 ranks";
  auto comm = test::world();
  const int me = comm->rank();
  Buffer big(DType::i32, 1 << 20), small(DType::i32, 8), urgent_data(DType::f32, 4);
  comm->barrier()->wait(30s);
  AllreduceOptions urgent;
  urgent.priority = 10;
  P2POptions options;
  options.round = 1;
  if (me == 0) {
    fill_round(big, me, 1);
    fill_round(small, me, 1);
    // Active until rank 1 joins it, 400 ms from now.
    WorkPtr allreduce = comm->allreduce(urgent_data.view(), ExecContext::host(), urgent);
    const auto posted = Clock::now();
    options.deadline = posted + 100ms;
    // `big` goes by rendezvous and stays in flight until rank 1 takes it, so
    // `small` is held back past the deadline.
    WorkPtr sent =
        comm->point_to_point({P2POp::send(1, big.view(), 20), P2POp::send(1, small.view(), 21)},
                             ExecContext::host(), options);
    sent->wait(30s);
    // The Work ends at its deadline: the send kept goes then, unthrottled,
    // and sends in flight stay with the engine.
    EXPECT_LT(Clock::now() - posted, 300ms) << "rank 1 comes 400 ms late";
    allreduce->wait(30s);
  } else {
    fill_untouched(big);
    fill_untouched(small);
    std::this_thread::sleep_for(400ms);
    WorkPtr allreduce = comm->allreduce(urgent_data.view(), ExecContext::host(), urgent);
    options.deadline = Clock::now() + 5s;
    WorkPtr received =
        comm->point_to_point({P2POp::recv(0, big.view(), 20), P2POp::recv(0, small.view(), 21)},
                             ExecContext::host(), options);
    allreduce->wait(30s);
    received->wait(30s);
    EXPECT_FALSE(received->partial()) << "the rest of a begun batch was dropped";
    EXPECT_EQ(count_wrong(big, 0, 1), 0);
    EXPECT_EQ(count_wrong(small, 0, 1), 0);
  }
  EXPECT_FALSE(comm->poisoned());
  comm->barrier()->wait(30s);
}

TEST(Deadlines, NeedARound) {
  auto comm = test::world();
  Buffer b(DType::i32, 4);
  P2POptions options;
  options.deadline = Clock::now() + 1s;
  EXPECT_THROW(comm->point_to_point({P2POp::send(0, b.view())}, ExecContext::host(), options),
               InvalidArgument);
  // started_deadline needs a deadline, and must not be earlier than it.
  options.round = 1;
  options.started_deadline = *options.deadline - 1ms;
  EXPECT_THROW(comm->point_to_point({P2POp::send(0, b.view())}, ExecContext::host(), options),
               InvalidArgument);
  options.deadline.reset();
  EXPECT_THROW(comm->point_to_point({P2POp::send(0, b.view())}, ExecContext::host(), options),
               InvalidArgument);
}

}  // namespace
}  // namespace relaxcc
