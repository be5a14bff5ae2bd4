// Batched non-blocking point-to-point: a list of sends and receives that
// complete together as one Work (NCCL's ncclGroupStart/End maps onto it).
//
// Each send travels with a small header (dtype, count), so a receive whose
// dtype or count differs from the matching send raises PeerMismatch on the
// receiver, and its buffer is never written past its end. Messages between
// one pair of ranks with one tag arrive in the order they were posted.
// Aliasing: a receive's buffer must not overlap any other buffer of the
// batch (InvalidArgument); sends may share buffers.
//
// Rounds and deadlines (gossip, group and asynchronous averaging, where a
// slow peer must not hold the others up):
//   - A batch with a round (P2POptions::round > 0) stamps each send with it.
//     Its receives take from (peer, tag) the message of their round: an
//     older one is late and is dropped (CommStats::late_messages), never
//     written into the tensor; a newer one means the peer skipped this round
//     (the receive is missing, the message is kept for its own round). Round
//     and plain messages on one (peer, tag) are separate streams: both sides
//     of a stream must use rounds, and a sender's rounds on one (peer, tag)
//     must increase. A round receive writes its tensor only when its whole
//     message arrived; round receives on one (peer, tag) take turns in
//     submission order. A send's data is copied when the batch starts, so
//     the caller may change it once the Work completed, even while the send
//     is still in flight.
//   - A batch with a deadline (P2POptions::deadline; it needs a round)
//     completes when every receive arrived and every send went out, or when
//     the deadline passed, whichever is first, without error and without
//     poisoning: Work::contributors() names the peers whose message arrived,
//     Work::missing_peers() those whose receive was abandoned (their tensor
//     untouched). Sends not posted by then (held back behind higher-priority
//     operations) are dropped, but those to a peer that was already sent a
//     message of the batch, which are posted at once (its batch has begun
//     and waits for the rest; if it gave up, it drops them as late). A late
//     message of an abandoned round is recognised by its round and dropped:
//     by the next round receive on its (peer, tag), or, while there is none,
//     by the engine's sweeper, which looks for it every millisecond for
//     RELAXCC_TIMEOUT_MS after the deadline. So a sender whose peer gave up
//     has its send completed (and its copy freed) once the message reaches
//     the peer, within that bound of the deadline, while the peer lives;
//     sends still in flight at the deadline stay with the engine until then,
//     not with the Work. Errors other than lateness (PeerMismatch for a
//     different dtype or count, CorruptPayload, a transport error) still
//     fail the Work.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "relaxcc/collectives/options.h"
#include "relaxcc/tensor.h"

namespace relaxcc {

struct P2POp {
  enum class Kind : uint8_t { send = 0, recv = 1 };
  Kind kind = Kind::send;
  int peer = 0;
  TensorView tensor;
  int tag = 0;  // 0 <= tag <= Communicator::max_p2p_tag()

  static P2POp send(int peer, const TensorView& t, int tag = 0) {
    return {Kind::send, peer, t, tag};
  }
  static P2POp recv(int peer, const TensorView& t, int tag = 0) {
    return {Kind::recv, peer, t, tag};
  }
};

struct P2POptions : OpOptions {
  // Non-zero: the batch's messages carry this round (see above).
  uint64_t round = 0;
  // When set (only with a round): the batch completes at this time at the
  // latest (or at started_deadline, below), with the receives that have not
  // arrived abandoned (see above).
  std::optional<std::chrono::steady_clock::time_point> deadline;
  // When set (only with a deadline, and not before it): a batch one of
  // whose receives has begun to take a message of this round by `deadline`
  // (a message, or the first part of one, is coming or came) is given until
  // this later time instead, while that receive still takes it. With one
  // batch per peer, `deadline` says by when a peer must have started sending
  // and this how long its transfer may take (the relaxed rounds' adaptive
  // deadline: peer_mixing).
  std::optional<std::chrono::steady_clock::time_point> started_deadline;
  // Only with a deadline: nothing of the batch is dropped as late. A receive
  // abandoned at the deadline leaves its message (coming or to come) for
  // the next receive of the same round on its (peer, tag), which takes it
  // by that receive's own deadline (no sweeper drops it meanwhile), and
  // sends not posted by the deadline are posted then.
  // For streams whose every message must be applied, in order, however late
  // (CHOCO's public copies, choco_gossip.h): the receiver asks for round
  // r + 1 only once round r arrived, and the sender numbers its messages on
  // the stream 1, 2, 3, ...
  bool keep_late = false;
};

}  // namespace relaxcc
