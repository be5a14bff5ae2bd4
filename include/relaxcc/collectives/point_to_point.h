// Batched non-blocking point-to-point: a list of sends and receives that
// complete together as one Work (NCCL's ncclGroupStart/End maps onto it).
//
// Each send travels with a small header (dtype, count), so a receive whose
// dtype or count differs from the matching send raises PeerMismatch on the
// receiver, and its buffer is never written past its end. Messages between
// one pair of ranks with one tag arrive in the order they were posted.
// Aliasing: a receive's buffer must not overlap any other buffer of the
// batch (InvalidArgument); sends may share buffers.
#pragma once

#include <cstdint>
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

struct P2POptions : OpOptions {};

}  // namespace relaxcc
