// Asynchronous model averaging: training waits for the network at most a
// round's deadline or the staleness bound.
//
// Every interval_steps steps (after warmup_steps), step() snapshots the
// parameters (under the parameters' lock) and starts averaging the snapshot
// with the peers, at low priority, so bucket traffic on any communicator of
// the same engine goes first. The first step() after the average is done
// applies it, on the caller's thread, under the parameters' lock:
//   x += avg - snapshot
// which keeps whatever the optimizer did to x meanwhile. (Nothing runs on
// the engine's threads with the user's lock: a training loop may hold it
// across waits on other Works.) One average is in
// flight at a time (two would both pull x towards the mean: overshoot).
// step() itself only copies and submits. Every rank starts every due
// round, so a due average waits for the one still in flight, and any step
// waits for an average that has become too stale (started
// max_staleness_steps steps or max_staleness ago): no parameter ever misses
// more than max_staleness_steps steps of averaging. In a gossip mode with a
// deadline (the default: a learned one, adaptive_deadline.h) a round ends by
// its deadline and leaves a straggler out, so those waits are bounded by the
// deadline (milliseconds on a healthy link), never by the straggler: it
// slows the averages that need it, not the others' steps. Mode all (an
// allreduce of every rank) and gossip without a deadline (learn_deadline
// false, no round_deadline) need every rank in every round: there the
// slowest rank sets the pace.
// A wait lasts at most stop_timeout: a peer that never comes gives Timeout,
// which poisons the communicator.
//
// The averaging is an allreduce of the snapshot (mode all: every rank's
// model enters) or a gossip round in any peer mode, with a deadline if
// given (slow peers are then left out of a round, see gossip.h). stop()
// waits at most stop_timeout for the average in flight and applies it if it
// came; after stop() a late average is never applied, so stop() returns in
// bounded time even while a peer is slow, and neither the parameters nor
// their lock are touched once it returned: they must outlive stop() only.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

#include "relaxcc/communicator.h"
#include "relaxcc/relaxed/gossip.h"

namespace relaxcc {

struct AsyncAverageOptions {
  int64_t interval_steps = 1;
  int64_t warmup_steps = 0;
  int64_t max_staleness_steps = 8;
  std::chrono::milliseconds max_staleness{10000};
  // all: an allreduce of every rank's snapshot; otherwise a gossip round.
  GossipMode mode = GossipMode::shift_one;
  // Gossip modes: each round's deadline, counted from its start (0: none),
  // or a learned one: `adaptive` if set, otherwise (learn_deadline) the
  // averager's own.
  std::chrono::microseconds round_deadline{0};
  AdaptiveDeadline* adaptive = nullptr;
  bool learn_deadline = true;
  int priority = -1;
  std::chrono::milliseconds stop_timeout{10000};
  RelaxedStats* stats = nullptr;
  // Gossip modes: the point-to-point tags (tag, tag + 1), and the number of
  // the first due average's round; each later due average takes the next
  // number. (tag, round) names a round (gossip.h):
  // one averager at a time per communicator and tag, and a later one on the
  // same communicator and tag starts past the earlier one's rounds
  // (first_round = earlier.last_round() + 1), so that a late message of the
  // earlier one is dropped by its round, never applied to a later round.
  int tag = 30400;
  uint64_t first_round = 1;
};

struct AsyncAverageCounts {
  int64_t started = 0;
  int64_t applied = 0;
  int64_t max_staleness_seen = 0;  // steps between a snapshot and its application
  int64_t waits = 0;               // step() calls that had to wait for a stale average
};

class AsyncModelAverager {
 public:
  // `params`: f32/f64/f16/bf16 host tensor that the training loop updates
  // under `params_lock`; each mode averages with its own weights (gossip.h).
  // Throws InvalidArgument, naming the rank, for intervals < 1, warmup < 0,
  // max_staleness_steps < 1, a mode that is none of GossipMode's, a
  // negative round_deadline, a deadline (fixed or adaptive) in mode all,
  // or, in a gossip mode, a tag outside [0, max_p2p_tag() - 1] or a
  // first_round of 0.
  AsyncModelAverager(CommunicatorPtr comm, TensorView params, std::mutex& params_lock,
                     AsyncAverageOptions options = {});
  ~AsyncModelAverager();  // stop()
  AsyncModelAverager(const AsyncModelAverager&) = delete;
  AsyncModelAverager& operator=(const AsyncModelAverager&) = delete;

  // Call once per training step, without holding the parameters' lock.
  void step();
  // Stops (see above). Returns whether the last average was applied (or
  // none was in flight). Idempotent. step() after stop() throws
  // InvalidArgument.
  bool stop();
  AsyncAverageCounts counts() const;
  // The round number of the last due average, the same on every rank after
  // the same steps; first_round - 1 before the first.
  uint64_t last_round() const { return round_; }
  // The learned deadline of the rounds (`adaptive`, or the averager's own;
  // null without one).
  AdaptiveDeadline* learned_deadline() const;

 private:
  struct Round;
  void start_round();
  // Applies the finished round in flight (round_state_) to the parameters.
  void apply_round();
  CommunicatorPtr comm_;
  TensorView params_;
  std::mutex& params_lock_;
  AsyncAverageOptions options_;
  mutable std::mutex counts_mutex_;  // counts() may be called from any thread
  AsyncAverageCounts counts_;
  int64_t steps_ = 0;
  uint64_t round_ = 0;  // last_round()
  WorkPtr in_flight_;
  std::unique_ptr<Round> round_state_;  // of in_flight_
  int64_t in_flight_step_ = 0;
  std::chrono::steady_clock::time_point in_flight_since_{};
  bool stopped_ = false;
  std::unique_ptr<AdaptiveDeadline> own_adaptive_;
};

}  // namespace relaxcc
