// RequestPoster: what an operation of a lane may do on the progress token's
// holder: post and cancel its requests, probe, spawn and compute.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "relaxcc/tunables.h"
#include "src/collectives/scratch_pool.h"
#include "src/engine/op_header.h"
#include "src/engine/transport.h"

namespace relaxcc::engine {

class Engine;
class Lane;
class Operation;
struct RoundStream;

// Posts the transport's requests for the operations of one lane. Peers are ranks of the
// lane; tags are the lane's. Valid only on the thread that holds the
// engine's progress token.
class RequestPoster {
 public:
  RequestPoster(Engine& engine, Lane& lane) : engine_(engine), lane_(lane) {}

  // Non-blocking send/receive in the collective (coll == true) or the
  // point-to-point tag space. `slot` comes back in on_complete.
  void isend(Operation& op, int64_t slot, const void* buf, size_t bytes, int peer, int tag,
             bool coll = true);
  void irecv(Operation& op, int64_t slot, void* buf, size_t bytes, int peer, int tag,
             bool coll = true);
  // isend/irecv outside the engine's request table, for
  // Operation::begin_direct: run_now() tests the request itself or hands it
  // to the table.
  Request post_isend(const void* buf, size_t bytes, int peer, int tag, bool coll = true);
  Request post_irecv(void* buf, size_t bytes, int peer, int tag, bool coll = true);
  // Matched probe in the collective (or point-to-point) tag space: when a
  // message from `peer` with `tag` is waiting, returns true with its handle
  // and size, so the receive can be sized to the message and nothing is
  // ever truncated.
  bool improbe(int peer, int tag, Message* message, size_t* bytes, bool coll = true);
  // Receives a probed message into `buf` (at least `bytes` long).
  void imrecv(Operation& op, int64_t slot, void* buf, size_t bytes, Message* message, int peer);
  // Cancels every pending receive of `op` posted with `slot` (posted with
  // irecv and not cancelled before; others are left to complete).
  void cancel_receives(Operation& op, int64_t slot);

  // A higher-priority operation (of any lane) is active: post one segment at a time.
  bool throttled(const Operation& op) const;
  int rank() const;
  int size() const;
  bool poisoned() const;
  // What the transport's error `code` (Completion::error) means.
  std::string error_string(int code) const;
  // The lane's identity check (OpHeader::lane): 0 for a communicator, a
  // hash of parent, members and key for a group.
  uint32_t lane_id() const;
  const Tunables& tunables() const;
  // The tag of `channel` for the lane's operation `seq` with lane rank
  // `peer`, in the lane's window for that peer (op_header.h).
  int collective_tag(uint64_t seq, Channel channel, int peer) const;
  // Scratch memory reused across operations (not zeroed).
  ScratchPool::Buffer scratch(size_t bytes);
  // The lane's stream of round messages from `peer` with point-to-point tag `tag`.
  RoundStream& round_stream(int peer, int tag);
  // Starts `op` on the lane of `from` (an operation of this lane), without a
  // Work or a sequence number, once the engine's current iteration ended.
  void spawn(const Operation& from, std::shared_ptr<Operation> op);
  // Runs `fn` (a reduction, a codec) on the engine's compute thread, so the
  // engine keeps polling the network meanwhile; op.on_computed(slot, error)
  // follows on the engine thread. The operation's Work does not complete
  // while a computation of it runs, even when it fails.
  void compute(Operation& op, int64_t slot, std::function<void()> fn);
  // Counts `n` late round messages dropped (CommStats::late_messages).
  void count_late(uint64_t n = 1);

 private:
  Engine& engine_;
  Lane& lane_;
};

}  // namespace relaxcc::engine
