// EdgeOp: the base of relaxcc's point-to-point collectives (the ring, recursive doubling).
//
// Protocol on every edge (a pair of ranks that exchange data):
//   1. Both ends send their OpHeader and receive the other's; both compare
//      the same two headers, so they agree whether the edge is live.
//   2. Sends are optimistic: a rank posts data as soon as its schedule has
//      it, before the peer's header arrived, so the header costs no round
//      trip. A first data message of at most kInlineBytes travels inside
//      the header message (one message instead of two for small
//      collectives): when it is ready at start, or later where the subclass
//      holds the header for it (hold_header_for_data). Receives are posted
//      only on a live edge, so a peer's data never lands in this rank's
//      buffers unless both called the same operation, and every receive is
//      sized from a matched header (or, when draining, a matched probe):
//      never a truncated receive.
//   3. A rank that fails (mismatched header, an abort record from a peer, a
//      local error) stops posting data. To every peer it still owes data,
//      and to every peer whose header mismatched, it sends one AbortRecord
//      with the number of data messages it did post. It receives every
//      message a peer posted: on a live edge the full schedule or the count
//      in the peer's AbortRecord; on a mismatched edge the count in the
//      peer's AbortRecord, each sized by a matched probe into a drain buffer
//      (the peer's schedule, message sizes included, is not this rank's).
//   Because every rank's output depends on every other rank, a failure
//   anywhere reaches every rank, and no message is left unmatched.
// First contact: every EdgeOp exchanges headers with the same peers, its
// ring neighbours and butterfly partners (first_contacts), whatever its own
// edges, plus header-only edges where they differ. So ranks that picked
// different algorithms (the ring here, recursive doubling there) still
// receive each other's headers, see the mismatch, and nobody waits for a
// header that never comes.
// An operation whose dependency failed (start_failed) opens its edges and
// fails at once: its peers get its header and an abort record, no data.
// A poisoned communicator aborts hard instead: cancel receives, tell peers,
// finish at once; sends that never complete stay parked in the engine.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "relaxcc/exec_context.h"
#include "relaxcc/tensor.h"
#include "src/engine/direct_exchange.h"
#include "src/engine/op_header.h"
#include "src/engine/operation.h"
#include "src/engine/request_poster.h"

namespace relaxcc::engine {

// A first data message up to this size may travel inside the header message,
// so that the two stay within Open MPI's shared-memory eager limit (4 KiB
// including MPI's own headers; a larger message goes by rendezvous,
// docs/benchmarks.md, small-message latency). Schedules that move a few KiB
// per step split their data into messages of this size (eager ones).
inline constexpr size_t kInlineBytes = 4000 - sizeof(OpHeader);
inline constexpr size_t kHeaderMessageBytes = sizeof(OpHeader) + kInlineBytes;

// The ranks every EdgeOp of `rank` exchanges headers with (see above), in
// increasing order; held inline.
struct FirstContacts {
  std::array<int, 36> ranks{};
  size_t count = 0;
  const int* begin() const { return ranks.data(); }
  const int* end() const { return ranks.data() + count; }
};
FirstContacts first_contacts(int rank, int size);

class EdgeOp : public Operation {
 public:
  EdgeOp(std::string name, int priority, std::string label);

  void start(RequestPoster& t) final;
  void start_failed(RequestPoster& t, std::exception_ptr error) final;
  void progress(RequestPoster& t) final;
  void on_complete(RequestPoster& t, int64_t slot, const Completion& completion) final;
  void abort(RequestPoster& t, std::exception_ptr error) final;
  bool done() const final { return finished_; }
  void set_agreement(uint64_t value, const std::string& what) final;
  std::string waiting_for() const override;

 protected:
  // Setup, before start: this rank's header and its edges. `msgs_from` and
  // `msgs_to` are the data messages the schedule exchanges with the peer;
  // `elems_from` and `elems_to` go into the edge's header (OpHeader's
  // from_peer and to_peer), for schedules whose counts differ per edge.
  void set_header(const OpHeader& h) { header_ = h; }
  int add_peer(int rank, int64_t msgs_from, int64_t msgs_to, int64_t elems_from = 0,
               int64_t elems_to = 0);
  // The first data message to this peer is at most kInlineBytes: if it is
  // not ready at start, the header waits for it and both travel as one
  // message (sent at once when this rank fails). Each data message a header
  // waits for must depend only on earlier messages of the schedule.
  void hold_header_for_data(int pi) { peers_[pi].hold_header = true; }
  // For reuse (Operation::reset_for_reuse), with the same edges: they and
  // their header buffers stay, the protocol starts afresh; `label` names
  // the next call.
  void reset_edges(const std::string& label);

  // Posts data; called while the operation runs and is not aborted.
  virtual void run(RequestPoster& t) = 0;
  virtual void on_sent(RequestPoster& t, int peer_index, int64_t msg) = 0;
  virtual void on_received(RequestPoster& t, int peer_index, int64_t msg) = 0;
  // The data schedule finished on this rank.
  virtual bool data_done() const = 0;

  // Receives may be posted on a live edge only (both headers matched); sends
  // on any edge while the operation is not aborted (a mismatched edge aborts
  // it).
  bool edge_live(int pi) const { return peers_[pi].live; }
  // The peer's header; valid once the edge is live.
  const OpHeader& peer_header(int pi) const { return peers_[pi].header_in; }
  void send_data(RequestPoster& t, int pi, int64_t msg, const void* buf, size_t bytes);
  void recv_data(RequestPoster& t, int pi, int64_t msg, void* buf, size_t bytes);

  // The direct path (Operation::begin_direct) of an operation of two ranks
  // that sends the other `count` data messages (the first at most
  // kInlineBytes) and expects as many back. can_exchange() says whether the
  // edges allow it. begin_exchange() does what start() does: the first
  // message inline in the header message, the others behind it, then the
  // receive of the peer's header message, all posted outside the engine's
  // table into `x`. The subclass records that it sent them.
  struct Part {
    const void* data;
    size_t bytes;
  };
  bool can_exchange(RequestPoster& t, int count) const;
  void begin_exchange(RequestPoster& t, const Part* parts, int count, DirectExchange& x);
  // The peer's inline data message of `bytes`, once its header message
  // arrived in `x`; null, changing nothing, unless the peer's header matches
  // this rank's and carries exactly that message.
  unsigned char* exchanged_data(const DirectExchange& x, size_t bytes) const;
  // Takes the peer's header message that exchanged_data() accepted (the
  // protocol will not see it again), so that the peer's data message `msg`
  // (1 and up) can be received into `buf`, outside the engine's table, into
  // `x`. exchanged_first() is then its first data message.
  void take_exchanged_header(DirectExchange& x);
  bool exchange_taken() const { return exchanged_header_ > 0; }
  unsigned char* exchanged_first() const { return peers_[0].header_buf.data() + sizeof(OpHeader); }
  void receive_exchanged(RequestPoster& t, int64_t msg, void* buf, size_t bytes, DirectExchange& x);
  // Operation::leave_direct once the header was taken: the edge as the
  // protocol leaves it when the header message arrives and the data
  // receives are posted (message 0 delivered; the abort record's receive
  // posted now).
  void leave_exchange(RequestPoster& t);

 private:
  struct Peer {
    int rank = -1;
    int header_tag = 0;  // the tag of Channel::header with this peer (its window's)
    int64_t msgs_from = 0, msgs_to = 0;
    int64_t elems_from = 0, elems_to = 0;
    OpHeader header_in;
    // The header messages, each the header, then possibly the first data
    // message: one scratch buffer (not zeroed) of 2 x kHeaderMessageBytes, the
    // peer's (header_buf, of which header_len bytes are in use: 0 once
    // taken), then this rank's (header_out, header_out_len bytes).
    ScratchPool::Buffer header_buf;
    unsigned char* header_out = nullptr;
    size_t header_len = 0, header_out_len = 0;
    bool inline_out = false;   // this rank's data message 0 rides in header_out
    bool hold_header = false;  // the header waits for a small data message 0
    bool header_sent = false;
    bool inline_in = false;     // the peer's data message 0 rode in its header
    bool inline_ready = false;  // copied into its receive, to be delivered
    bool header_received = false;
    bool live = false;
    bool mismatch = false;
    int64_t posted_in = 0, completed_in = 0, posted_out = 0, completed_out = 0;
    AbortRecord abort_in, abort_out;
    bool abort_recv_posted = false;
    bool abort_received = false;
    bool abort_sent = false;
    bool draining = false;  // a drain receive is in flight
    // Messages to receive: the schedule, cut to the peer's abort count; from
    // a mismatched peer its abort count (none known before it arrived).
    int64_t limit_in() const {
      const int64_t sent = abort_received ? std::max<int64_t>(abort_in.sent, 0) : msgs_from;
      return mismatch ? (abort_received ? sent : 0) : std::min(msgs_from, sent);
    }
    std::vector<unsigned char> drain;
  };
  enum SlotKind : int64_t {
    kHeaderSend = 1,
    kHeaderRecv,
    kAbortSend,
    kAbortRecv,
    kDataSend,
    kDataRecv,
    kDrainRecv
  };
  static int64_t slot(SlotKind kind, int pi, int64_t index) {
    return (static_cast<int64_t>(kind) << 56) | (static_cast<int64_t>(pi) << 40) | index;
  }

  // start(): first contacts and this rank's edges.
  void open_edges(RequestPoster& t);
  // Posts the header receive of every edge (once, in start()).
  void receive_headers(RequestPoster& t);
  // This rank's header on edge `pi`.
  OpHeader edge_header(int pi) const;
  // `lost`: the lane rank whose loss failed it (-1: none), for the abort records.
  void fail(RequestPoster& t, std::exception_ptr error, const std::string& reason, AbortKind kind,
            int lost = -1);
  void send_abort(RequestPoster& t, int pi);
  void post_abort_recv(RequestPoster& t, int pi);
  void send_header(RequestPoster& t, int pi);
  // This rank's header message to peer `pi` with the data message `buf`
  // (of at most kInlineBytes) inside, ready to send.
  void put_inline(int pi, const void* buf, size_t bytes);
  // The peer's header message of `got` bytes arrived in its buffer: its
  // header, and whether a data message rides in it.
  void take_header_message(Peer& p, size_t got);
  void drain(RequestPoster& t);
  // Hands inline data messages copied by recv_data to on_received (outside
  // run(), which posted them).
  void deliver_inline(RequestPoster& t);
  void check_finished(RequestPoster& t);
  // The operation's tag on channel `c` with peer `p` (open_edges computed
  // the first).
  static int tag(const Peer& p, Channel c) { return p.header_tag + static_cast<int>(c); }

  std::string label_;
  OpHeader header_;
  std::string agree_what_;          // names header_.agree's arguments in mismatch messages
  bool collecting_inline_ = false;  // start(): the first run() may fill header messages
  struct Deferred {                 // start(): data sends held back until the headers are out
    int pi;
    int64_t msg;
    const void* buf;
    size_t bytes;
  };
  std::vector<Deferred> deferred_;
  // The direct path: the receive of the peer's header message in its
  // DirectExchange, the bytes of that message once taken (0: not taken),
  // the data receives posted since.
  int exchange_header_request_ = 0;
  size_t exchanged_header_ = 0;
  int64_t exchanged_posted_ = 0;
  std::vector<Peer> peers_;
  bool contacts_added_ = false;  // open_edges added the first contacts (reuse keeps them)
  bool started_ = false;
  bool aborted_ = false;
  bool hard_abort_ = false;
  bool finished_ = false;
  std::string abort_reason_;
  AbortKind abort_kind_ = AbortKind::error;
  int abort_origin_ = -1;
  int abort_lost_ = -1;
};

}  // namespace relaxcc::engine
