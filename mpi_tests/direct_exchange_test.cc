// The direct exchange of two ranks (Engine::run_now's direct path,
// Operation::begin_direct) handed over to the protocol after the peer's
// header message arrived and the receives of the further parts were posted.
// Rank 0 runs a recursive-doubling allreduce of 4 KiB (two parts: one inside
// the header message, one on the data channel) on an engine of its own; rank
// 1 plays its peer by hand, with raw MPI on the lane's communicator: its
// header message is there before rank 0 calls, and what follows it comes
// far later than rank 0's polling budget, so the hand-over happens at that
// stage every time.
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "relaxcc/collectives/allreduce.h"
#include "relaxcc/errors.h"
#include "src/communicator/engine_communicator.h"
#include "src/engine/engine.h"
#include "src/engine/op_header.h"
#include "src/mpi/mpi_transport.h"
#include "src/protocols/recursive_doubling.h"
#include "test_util.h"

namespace relaxcc::engine {
namespace {

using namespace std::chrono_literals;
using test::Buffer;

constexpr int64_t kCount = 1024;  // i32: 4096 bytes, two parts
constexpr size_t kSecondPart = kCount * sizeof(int32_t) - kInlineBytes;

// Both ranks' view of one lane of two ranks over a duplicate of
// MPI_COMM_WORLD (collective: both ranks build it).
class DirectExchangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    if (size_ != 2) GTEST_SKIP() << "plays the peer of a lane of exactly two ranks";
    MPI_Comm p2p = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &coll_);
    MPI_Comm_dup(MPI_COMM_WORLD, &p2p);
    auto transport = std::make_shared<mpi::MpiTransport>();
    comms_ =
        std::make_shared<EndpointSet>(std::make_shared<mpi::MpiEndpoints>(transport, coll_, p2p));
    if (rank_ == 0) {
      engine_ = std::make_shared<Engine>(tunables_, Engine::Polling{}, transport);
      lane_ = engine_->add_lane(comms_, {}, 0, 0, {}, tunables_);
    }
  }
  void TearDown() override {
    if (size_ != 2) return;
    MPI_Barrier(coll_);
    lane_.reset();
    engine_.reset();
  }
  // Rank 0: the allreduce of its `data` (rank and index encoded) through
  // run_now, once the peer's header message is there; the call must hand
  // it over after taking that message. Returns its Work (null when it
  // completed within the call).
  WorkPtr run_handed_over(Buffer& data) {
    test::fill(data, 0);
    auto done = std::make_shared<Work>("done");
    done->complete(nullptr);
    auto op = std::make_shared<RecursiveDoublingOp>(
        "allreduce", 0, "", data.view(), ReduceOp::sum, 0, 2, ExecContext::host(),
        static_cast<int>(AllreduceAlgo::recursive_doubling));
    MPI_Barrier(MPI_COMM_WORLD);  // behind the peer's header message
    WorkPtr work = engine_->run_now(
        lane_, op, [] { return std::string("by hand"); }, OpOptions{}, done);
    EXPECT_NE(work, done) << "completed within the call: the peer's part was not held back";
    // The second part's receive and the abort record's are pending (before
    // the header was taken only its receive would be).
    EXPECT_EQ(engine_->stats(*lane_).requests_pending, 2);
    return work == done ? nullptr : work;
  }
  int tag(Channel c) const { return collective_tag(0, 1, c, comms_->max_tag); }
  // Rank 1: sends the header message of the call rank 0 makes, with this
  // rank's first part, before rank 0 makes it; then takes rank 0's header
  // message and second part. Returns this rank's data.
  Buffer send_header_first() {
    Buffer mine(DType::i32, kCount);
    test::fill(mine, 1);
    OpHeader h;
    h.type = OpType::allreduce;
    h.dtype = DType::i32;
    h.op = ReduceOp::sum;
    h.algo = static_cast<uint8_t>(AllreduceAlgo::recursive_doubling);
    h.flags = kHeaderInlineData;
    h.seq = 1;
    h.count = kCount;
    std::vector<unsigned char> out(sizeof(OpHeader) + kInlineBytes);
    std::memcpy(out.data(), &h, sizeof(OpHeader));
    std::memcpy(out.data() + sizeof(OpHeader), mine.view().data, kInlineBytes);
    MPI_Send(out.data(), static_cast<int>(out.size()), MPI_BYTE, 0, tag(Channel::header), coll_);
    MPI_Barrier(MPI_COMM_WORLD);
    std::vector<unsigned char> in(kHeaderMessageBytes);
    MPI_Recv(in.data(), static_cast<int>(in.size()), MPI_BYTE, 0, tag(Channel::header), coll_,
             MPI_STATUS_IGNORE);
    OpHeader theirs;
    std::memcpy(&theirs, in.data(), sizeof(OpHeader));
    EXPECT_TRUE(same_call(h, theirs)) << describe(theirs, 0);
    std::vector<unsigned char> second(kSecondPart);
    MPI_Recv(second.data(), static_cast<int>(second.size()), MPI_BYTE, 0, tag(Channel::data), coll_,
             MPI_STATUS_IGNORE);
    return mine;
  }

  // A polling budget of 100 ms without progress: the peer's header message
  // arrives well within it, the held-back part well after it. No
  // heartbeats: rank 1 has no engine to take them, and a message left
  // unreceived would reach the next test's communicator (MPI reuses a freed
  // communicator's id).
  Tunables tunables_ = [] {
    Tunables t = Tunables::from_env();
    t.spin_us = 100'000;
    t.peer_timeout_ms = 0;
    return t;
  }();
  int size_ = 1, rank_ = 0;
  MPI_Comm coll_ = MPI_COMM_NULL;  // the collective space of comms_
  std::shared_ptr<EndpointSet> comms_;
  std::shared_ptr<Engine> engine_;
  std::shared_ptr<Lane> lane_;
};

// The second part comes 500 ms late: rank 0's call returns a Work of its
// own, which completes with the exact sum once it arrives; every byte is
// counted once.
TEST_F(DirectExchangeTest, HandedOverWithAPartToComeCompletesExactly) {
  if (rank_ == 1) {
    Buffer mine = send_header_first();
    std::this_thread::sleep_for(500ms);
    MPI_Send(static_cast<unsigned char*>(mine.view().data) + kInlineBytes,
             static_cast<int>(kSecondPart), MPI_BYTE, 0, tag(Channel::data), coll_);
    return;
  }
  Buffer data(DType::i32, kCount);
  WorkPtr work = run_handed_over(data);
  ASSERT_TRUE(work);
  work->wait(10s);
  for (int64_t i = 0; i < kCount; ++i)
    ASSERT_EQ(data.as<int32_t>()[i], test::expected_reduction<int32_t>(i, ReduceOp::sum, 2)) << i;
  const CommStats stats = engine_->stats(*lane_);
  const uint64_t bytes = sizeof(OpHeader) + kInlineBytes + kSecondPart;
  EXPECT_EQ(stats.bytes_sent, bytes);
  EXPECT_EQ(stats.bytes_received, bytes);
  EXPECT_EQ(stats.operations, 1u);
  EXPECT_EQ(stats.requests_pending, 0);
}

// Instead of its second part the peer sends an abort record (it failed
// after its header message went out): rank 0's call fails with the peer's
// reason, and its receive of the part that never comes is cancelled.
TEST_F(DirectExchangeTest, HandedOverThenAnAbortRecordFailsTheCall) {
  if (rank_ == 1) {
    send_header_first();
    std::this_thread::sleep_for(500ms);
    AbortRecord abort;
    abort.origin = 1;
    abort.sent = 1;  // the part inside the header message
    abort.set_reason("out of memory by hand");
    MPI_Send(&abort, sizeof(AbortRecord), MPI_BYTE, 0, tag(Channel::abort), coll_);
    return;
  }
  Buffer data(DType::i32, kCount);
  WorkPtr work = run_handed_over(data);
  ASSERT_TRUE(work);
  try {
    work->wait(10s);
    FAIL() << "the call succeeded without the peer's second part";
  } catch (const CommunicationError& e) {
    EXPECT_NE(e.message().find("rank 1 failed: out of memory by hand"), std::string::npos)
        << e.message();
  }
  EXPECT_EQ(engine_->stats(*lane_).requests_pending, 0);
}

// Tunables that reach the engine without a wing's factory are checked all
// the same, by the one check (check_tunables): the Engine constructor and
// create_engine_communicator throw InvalidArgument naming the variable
// before they start or connect anything (every rank of the world, alone).
TEST(TunablesChecked, ByTheEngineAndByCreateEngineCommunicator) {
  for (int variant = 0; variant < 2; ++variant) {
    Tunables bad = Tunables::from_env();
    const char* name = variant == 0 ? "RELAXCC_PEER_TIMEOUT_MS=50" : "RELAXCC_ENGINE_POLL='spin'";
    if (variant == 0)
      bad.peer_timeout_ms = 50;
    else
      bad.engine_poll = "spin";
    auto transport = std::make_shared<mpi::MpiTransport>();
    try {
      Engine engine(bad, Engine::Polling{}, transport);
      ADD_FAILURE() << "Engine accepted " << name;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(e.message().find(name), std::string::npos) << e.message();
    }
    MPI_Comm coll = MPI_COMM_NULL, p2p = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_SELF, &coll);
    MPI_Comm_dup(MPI_COMM_SELF, &p2p);
    auto endpoints = std::make_shared<mpi::MpiEndpoints>(transport, coll, p2p);
    EngineCommunicatorOptions o;
    o.tunables = bad;
    o.timeout = 1s;
    try {
      create_engine_communicator(transport, endpoints, o);
      ADD_FAILURE() << "create_engine_communicator accepted " << name;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(e.message().find(name), std::string::npos) << e.message();
    }
  }
}

}  // namespace
}  // namespace relaxcc::engine
