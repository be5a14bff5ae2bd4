// Heartbeat: the liveness check of the peers of one endpoint set, the same
// for every wing. Each rank sends a beat to every other rank of the set
// every RELAXCC_PEER_TIMEOUT_MS / 4 over a LivenessChannel
// (liveness_channel.h): the wing's own (UCX: a UDP socket per set, so beats
// never queue behind bulk data) or the transport's tagged messages on
// heartbeat_tag(max_tag) of the collective space (no protocol uses it),
// taken with one receive per peer (a message that a stopped peer left
// half-sent blocks its own receive, not the others'). A peer silent for
// RELAXCC_PEER_TIMEOUT_MS is declared
// lost: Endpoints::fail_peer, which reports it as a PeerError (the engine
// then fails and poisons the lanes with that peer and sends their poison
// notices). Word from a peer is its heartbeat or any receive of the engine's
// from it that completed (Endpoints::heard_count, looked at every step): a
// peer whose heartbeats queue behind its bulk data on a slow link is alive
// as long as that data arrives. Silence counts from its latest word, or, for a peer never
// heard from, from this set's first poll, or, when its creator announced a
// creation handshake (Endpoints::creating), from the poll after the
// handshake; while the handshake runs such a peer has until one timeout
// before the handshake's deadline (a slow creator is not lost; a stopped
// one is named before the handshake's Timeout). Only watched silence
// counts: when this rank itself did not poll for half the timeout (it was
// descheduled or stopped), that gap is not held against its peers (one such
// gap per timeout).
// A rank whose set is released (its communicators are gone) tells its peers
// it leaves and takes what they sent until each answered (or left too):
// they stop timing it and sending to it, and no heartbeat stays unreceived
// (the engine keeps the set, and its transport communicator, until then).
//
// Cost: the engine's poll of poison notices runs it (Engine::poll_notices:
// every millisecond while operations run, every kIdleNoticePoll when idle);
// each poll takes the beats that arrived, and every step (kHeartbeatStep)
// it sends what is due and judges: size - 1 beats per period, nothing per
// operation (but a relaxed load and store per completed receive, the
// evidence above).
//
// Token holder only, like the rest of the engine's progress.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/engine/clock.h"
#include "src/engine/liveness_channel.h"
#include "src/engine/transport.h"

namespace relaxcc::engine {

// The tag of heartbeats in the collective space: max_tag itself, above every
// collective_tag() (op_header.h), and not kNoticeTag.
inline int heartbeat_tag(int max_tag) {
  return max_tag;
}

// How often a heartbeat set looks at its receives and its peers' deadlines.
inline constexpr auto kHeartbeatStep = std::chrono::milliseconds(10);

class Heartbeat {
 public:
  // For `endpoints` (at least 2 ranks), with a peer timeout of `timeout`
  // (positive). Its beats go over the endpoints' own liveness channel
  // (Endpoints::liveness_channel) or, when they offer none, as tagged
  // messages of the transport. Starts listening at the first poll().
  Heartbeat(std::shared_ptr<Endpoints> endpoints, std::chrono::milliseconds timeout);
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Takes the heartbeats that arrived, sends those due, and declares the
  // peers silent for the timeout lost. Cheap until the next step.
  void poll(Clock::time_point now);
  // `rank` was lost by other means (a transport's PeerError): no more
  // heartbeats to it, no verdict on it.
  void forget(int rank);
  // Leaving, in three calls: begin_release() tells the peers this rank
  // leaves; released() takes their heartbeats and says whether each one
  // answered or left too (poll it until true or until the caller gives up,
  // without blocking); close() stops listening by `deadline`, false when a
  // receive is still posted: then this object (its buffers) must never be
  // freed. A set closed before its peers answered may leave their beats
  // unreceived (MPI delivers them to a later communicator that reuses the
  // context id), so the engine keeps polling a released set in the
  // background (Engine::releasing_) until it answered or a peer timeout
  // passed.
  void begin_release();
  bool released(Clock::time_point now);
  bool close(Clock::time_point deadline);

 private:
  struct Peer {
    Clock::time_point heard{};  // the latest word from it (epoch: none yet)
    uint64_t received = 0;      // Endpoints::heard_count when last looked at
    bool lost = false;          // no heartbeats to it, no verdict on it
    bool done = false;          // it left, or answered this rank's leaving
  };
  void take_heartbeats(Clock::time_point now);
  void on_beat(int rank, Beat beat, Clock::time_point now);
  // The engine's receives that completed since the last step: word from
  // their senders too.
  void take_evidence(Clock::time_point now);
  // When a peer never heard from is lost: one timeout after the first poll
  // (after the creation handshake when the set announced one:
  // Endpoints::creating), or while that handshake runs, one timeout before
  // its deadline if that is later.
  Clock::time_point never_heard_deadline() const;

  const std::shared_ptr<Endpoints> endpoints_;
  const std::unique_ptr<LivenessChannel> channel_;
  const std::chrono::milliseconds timeout_;
  const Clock::duration period_;
  std::vector<Peer> peers_;
  Clock::time_point started_{};        // the first poll
  Clock::time_point last_poll_{};      // the latest poll
  Clock::time_point last_forgiven_{};  // the latest poll after a forgiven gap
  Clock::time_point next_step_{};
  Clock::time_point next_send_{};
  bool leaving_ = false;  // release() began
  bool created_ = false;  // Endpoints::is_created() was seen
};

}  // namespace relaxcc::engine
