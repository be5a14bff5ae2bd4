// A batch of sends and receives completed as one Work, in one of two wire
// forms (relaxcc/collectives/point_to_point.h has the contract):
//   plain  each send posts a small header (dtype, count) and then the data.
//          Each receive takes the header first and only then posts the data
//          receive: into the caller's tensor when dtype and count match,
//          otherwise into scratch of the sender's size (then PeerMismatch),
//          so the tensor is never written past its end and no message is
//          left unmatched. Tags: header 3*tag, data 3*tag+1.
//   round  (P2POptions::round) each send is one message, RoundHeader and a
//          copy of the data, on tag 3*tag+2; to a rank on another node, in
//          parts of RELAXCC_ROUND_PART_BYTES (RoundHeader::part_bytes),
//          each small enough to go eagerly: no rendezvous handshake waits
//          behind the opposite direction's data, and no part goes as Open
//          MPI's emulated TCP put. The receiver takes the first part
//          as below and posts the others' receives at once (MPI keeps one
//          sender's messages on a tag in order), so a stream's message is
//          always whole before it is sorted. The first round receive of a
//          RoundStream probes for the next message (improbe), takes it
//          into scratch sized to it and sorts it by round: older ones are
//          dropped, its own is copied into the tensor, a newer one is kept
//          (RoundStream::early) and the receive is missing. At the deadline,
//          receives still waiting are abandoned; a RoundSweeper drops their
//          late messages while no other receive waits on the stream (with
//          keep_late, nothing is dropped: the next receive of the round
//          takes its message).
// Data sends go out in batch order, one at a time while a higher-priority
// operation is active (RequestPoster::throttled); a message in parts goes whole.
#pragma once

#include <optional>
#include <vector>

#include "relaxcc/collectives/point_to_point.h"
#include "src/engine/clock.h"
#include "src/engine/lane.h"
#include "src/engine/operation.h"
#include "src/engine/request_poster.h"

namespace relaxcc::engine {

// The smallest part and the most parts of a round message in parts (a
// header announcing others is corrupt).
inline constexpr uint64_t kMinRoundPartBytes = 1024;
inline constexpr uint64_t kMaxRoundParts = uint64_t{1} << 24;

// Leads every message of a round stream.
struct RoundHeader {
  uint32_t magic = 0;
  uint8_t dtype = 0;
  uint8_t pad[3] = {0, 0, 0};
  int64_t count = 0;
  uint64_t round = 0;
  // 0: the message is one transport message. Otherwise the data goes in parts of
  // this many bytes (the last shorter), the header riding with the first.
  uint64_t part_bytes = 0;
};
static_assert(sizeof(RoundHeader) == 32);

// A round message that arrives in parts: once its first part came, the
// whole message's buffer and the parts still to come.
struct RoundParts {
  ScratchPool::Buffer message;
  size_t bytes = 0;
  int64_t left = 0;
  int error = 0;  // of the first part whose receive failed (the transport's code)
};
// The first part of a round message came into `first` (`got` bytes) on
// `stream` from `peer`, user tag `tag`. When its header announces more
// parts, moves it into a buffer of the whole message in `parts`, posts the
// other parts' receives for `op` with `slot` (each counted in
// stream.matched) and returns true. Otherwise (one message, or a header
// that does not add up, left to the caller to judge) returns false.
bool receive_round_parts(RequestPoster& t, Operation& op, int64_t slot, RoundStream& stream,
                         int peer, int tag, ScratchPool::Buffer& first, size_t got,
                         RoundParts& parts);
// On completion of a part of `parts` (left > 0): true once the message is whole.
inline bool round_part_arrived(RoundParts& parts) {
  return --parts.left == 0;
}

// The point-to-point tag of the plain header, plain data and round channels
// of user tag `tag`; Communicator::max_p2p_tag() keeps them in range.
enum class P2PChannel : int { header = 0, data = 1, round = 2 };
inline int p2p_tag(int tag, P2PChannel channel) {
  return 3 * tag + static_cast<int>(channel);
}

class P2PBatchOp final : public Operation {
 public:
  // `part_bytes[i]`: the part size of round send i (0: one message).
  P2PBatchOp(std::vector<P2POp> ops, const P2POptions& options, std::vector<int64_t> part_bytes);
  ~P2PBatchOp() override;

  void start(RequestPoster& t) override;
  void progress(RequestPoster& t) override;
  void on_complete(RequestPoster& t, int64_t slot, const Completion& completion) override;
  void abort(RequestPoster& t, std::exception_ptr error) override;
  bool collective() const override { return false; }
  bool done() const override;
  std::string waiting_for() const override;
  void report(Work& work) const override;

 private:
  struct Wire {
    uint32_t magic;
    uint8_t dtype;
    uint8_t pad[3];
    int64_t count;
  };
  enum class RecvState : uint8_t { waiting, receiving, arrived, missing };

  bool rounds() const { return round_ != 0; }
  // Posts data sends from next_data_send_ on (one message in flight when
  // throttled; a message in parts counts as one).
  void post_data_sends(RequestPoster& t);
  // The messages of round send `i`, and the bytes of its buffer message `m` spans.
  int64_t send_parts(size_t i) const;
  std::pair<size_t, size_t> send_part(size_t i, int64_t m) const;
  void on_plain_complete(RequestPoster& t, size_t i, bool is_header, int error);
  // Round receive `i` at the head of its stream: takes a kept message of its
  // round, or probes for the next one.
  void take_next(RequestPoster& t, size_t i);
  // The round message in buffers_[i] (`bytes` long) came in for receive `i`.
  void on_round_message(RequestPoster& t, size_t i, size_t bytes);
  // Receive `i` is settled: it leaves its stream.
  void settle(size_t i, RecvState state);
  // Takes what arrived for the round receives at the heads of their streams.
  void take_arrived(RequestPoster& t);
  // Whether round receive `i` has begun to take a message of this round;
  // whether one that had by the deadline still has (begun_).
  bool begun(size_t i) const;
  bool still_begun() const;
  // At the deadline: drops the sends not posted yet, but those to a peer
  // that was already sent a message of this batch.
  void drop_unstarted_sends();
  // Abandons every unsettled round receive (the deadline passed, or the
  // batch stops): its stream's sweeper drops its late message (keep_late:
  // the message is kept for the next receive of its round).
  void abandon_receives(RequestPoster& t);
  std::string where(size_t i) const;

  std::vector<P2POp> ops_;
  std::vector<Wire> headers_;
  std::string label_;
  uint64_t round_ = 0;
  std::optional<Clock::time_point> deadline_;
  std::optional<Clock::time_point> started_deadline_;
  bool keep_late_ = false;
  bool started_ = false;
  int outstanding_ = 0;
  size_t next_data_send_ = 0;  // ops_ before it: data sent or not a send
  std::vector<int64_t> part_bytes_;
  std::vector<RoundParts> parts_;  // round receives arriving in parts
  int data_sends_in_flight_ = 0;
  bool aborted_ = false;
  bool deadline_passed_ = false;
  // Per op: scratch (a plain receive's drain; a round send's message, a
  // round receive's message), its requests not completed yet, a round
  // receive's state and stream.
  std::vector<ScratchPool::Buffer> buffers_;
  std::vector<int> pending_;
  std::vector<RecvState> recv_state_;
  std::vector<bool> dropped_;  // sends dropped at the deadline
  std::vector<bool> begun_;    // receives begun by the deadline (sized then)
  std::vector<RoundStream*> streams_;
  int unsettled_ = 0;  // round receives
};

// Drops the late messages of a round stream whose receive was abandoned
// (RoundStream::abandoned), about every millisecond, until the message of
// that round came, a receive waits on the stream again, or sweep_until.
class RoundSweeper final : public Operation {
 public:
  RoundSweeper(RoundStream& stream, int peer, int tag);

  void start(RequestPoster&) override;
  void progress(RequestPoster& t) override;
  void on_complete(RequestPoster& t, int64_t slot, const Completion& completion) override;
  void abort(RequestPoster&, std::exception_ptr) override { finish(); }
  bool done() const override { return finished_; }
  bool collective() const override { return false; }
  bool background() const override { return true; }

 private:
  void finish();

  RoundStream& stream_;
  int peer_;
  int tag_;
  bool finished_ = false;
  bool receiving_ = false;
  ScratchPool::Buffer buffer_;
  RoundParts parts_;
};

}  // namespace relaxcc::engine
