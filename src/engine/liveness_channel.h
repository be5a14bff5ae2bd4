// LivenessChannel: how an endpoint set's heartbeats (heartbeat.h) travel.
// The heartbeat decides what to send and judges silence; a channel only
// carries beats. Two exist: the transport's own tagged messages (the
// default, heartbeat.cc) and one UDP socket per endpoint set (udp_channel.h),
// which a wing offers (Endpoints::liveness_channel) where its data shares a
// connection that bulk transfers can fill for longer than the peer timeout.
//
// Token holder only, like the heartbeat that owns it.
#pragma once

#include <cstdint>
#include <functional>

#include "src/engine/clock.h"

namespace relaxcc::engine {

// What a heartbeat says: alive, leaving (its set is released: no verdict on
// it any more), or the answer to a leaving rank (the last beat to it).
enum class Beat : uint64_t {
  alive = 0x5442485243435852,    // "RXCCRHBT"
  leaving = 0x4559425243435852,  // "RXCCRBYE"
  ack = 0x4b43415243435852,      // "RXCCRACK"
};

class LivenessChannel {
 public:
  virtual ~LivenessChannel() = default;
  // Sends `beat` to `rank` without blocking. An `alive` beat may be dropped
  // (one still in flight to that rank, a full socket); leaving and ack are
  // sent (a channel that may lose them sends them more than once).
  virtual void send(int rank, Beat beat) = 0;
  // Calls on_beat(rank, beat) for every beat that arrived, until none is
  // left (a beat left waiting may keep a transport's event fd readable).
  virtual void take(const std::function<void(int, Beat)>& on_beat) = 0;
  // The heartbeat gave up on `rank` (a verdict, another report, its
  // leaving): the channel need not listen to it anew, but takes what it
  // listens for already.
  virtual void lost(int rank) = 0;
  // Nothing more is expected from `rank` (it left, or answered this rank's
  // leaving): the channel may stop listening to it.
  virtual void ignore(int rank) = 0;
  // Stops listening to every rank, by `deadline`. False when something is
  // still posted: then this object (its buffers) must never be freed.
  virtual bool close(Clock::time_point deadline) = 0;
};

}  // namespace relaxcc::engine
