// Low-precision gossip in the CHOCO-SGD form (Koloskova et al., 2019).
//
// Every rank keeps public copies: x_hat_i of its own tensor and x_hat_j of
// each neighbour's. A round compresses q_i = Q(x_i - x_hat_i) with any
// compressor of relaxcc/kernels/compressor.h, sends q_i to the neighbours,
// and applies the same decoded q on both sides:
//   x_hat_i += D(q_i),  x_hat_j += D(q_j) for each neighbour j,
//   x_i += gamma * sum_j w_ij (x_hat_j - x_hat_i).
// Both sides add the same decoded values to the same starting copies (zero),
// so rank i's x_hat_j is bitwise rank j's own x_hat_j. With a symmetric W the
// correction terms cancel over the ranks, so the mean across ranks is kept up
// to float rounding: each round moves the sum by at most about
// c * n * eps * max|x_hat| (the test bounds it). (Bagua's low-precision
// decentralized form does not keep the mean: its issue #165.)
//
// Neighbours are fixed, as CHOCO needs: the ring (1/3 each; on 2 ranks the
// one neighbour, 1/2). f32 tensors (the compressors' type). One round at a
// time (InvalidArgument otherwise).
//
// Rounds without a deadline (ChocoRound empty) wait for both neighbours'
// q of the same round, and move the copies only once the whole exchange
// succeeded: a round that fails on this rank (PeerMismatch from a neighbour
// that compresses otherwise, after which the communicator stays usable; a
// transport error) leaves x and every copy on this rank as they were. Ranks
// whose round failed together stay in step; a neighbour whose own round
// succeeded (on 3 ranks or more, when only some neighbours disagree) has
// applied this rank's q, so load_copies() from a checkpoint on every rank
// before going on.
//
// Rounds with a deadline (fixed, or learned per neighbour: a straggler is
// not waited for, adaptive_deadline.h) never lose a q, so the copies stay
// bitwise equal however late a neighbour is: each rank numbers its q to a
// neighbour 1, 2, 3, ... and applies the neighbour's in that order
// (P2POptions::keep_late). A round sends this rank's q (its own copy moves
// at once), waits for each neighbour's next q until that neighbour's
// deadline, then takes every further q of it that has already come (a slow
// neighbour is behind by rounds, a fast one ahead: all are applied), and
// corrects x with the copies as they stand, over the neighbours whose q
// came by their deadline (a late neighbour is left out of the correction,
// as gossip leaves out a late peer). A late q is applied by a later round. Ranks may then run
// different numbers of rounds; the correction uses copies of different ages, so the mean is kept
// only up to the neighbours' lag rather than to float rounding. A round that fails (PeerMismatch, a
// transport error) may have moved some copies: load_copies() from a checkpoint on every rank before
// going on.
//
// The object must outlive the Works of its rounds.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "relaxcc/communicator.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/relaxed/adaptive_deadline.h"
#include "relaxcc/relaxed/relaxed_stats.h"

namespace relaxcc {

// How long one round waits for its neighbours (see above): neither set, for
// both; a fixed time; or learned per neighbour (takes precedence).
struct ChocoRound {
  std::optional<std::chrono::steady_clock::time_point> deadline;
  AdaptiveDeadline* adaptive = nullptr;
};

struct ChocoOptions {
  kernels::CompressorConfig codec;  // minmax 8-bit by default
  double gamma = 0.5;               // consensus step size, in (0, 1]
  int tag = 30300;                  // rounds without a deadline; tag + 1: with one
  int priority = 0;
  RelaxedStats* stats = nullptr;
};

class ChocoGossip {
 public:
  // Public copies of `numel` elements, zero. Throws InvalidArgument for a
  // gamma outside (0, 1] or an invalid codec.
  ChocoGossip(CommunicatorPtr comm, int64_t numel, ChocoOptions options = {});

  // One round on `x` (f32, numel elements), in place. `round` >= 1 and
  // increasing. A round with a deadline completes by its deadline, plus the
  // time to take each q that had begun to arrive by then (at most the
  // learned deadline's cap, or 2 s, per q); its Work is a composite of the
  // round's sends and receives (work.h: a wait that expires times out the
  // receive still pending). A round without a deadline after rounds with
  // one needs settle() first (InvalidArgument).
  WorkPtr step(const TensorView& x, uint64_t round, const ExecContext& ctx,
               const ChocoRound& timing = {});

  // After rounds with a deadline: applies every q the neighbours sent and
  // lets them apply every q this rank sent, so that the copies agree
  // (before a checkpoint, and at the end, so that no q is left in flight).
  // Blocking, between rounds, on every rank together (its neighbours' calls
  // meet it). Throws Timeout when a neighbour does not come within
  // `timeout`; without rounds with a deadline it returns at once.
  void settle(std::chrono::milliseconds timeout);
  // False after rounds with a deadline until settle(): the copies may then
  // differ across ranks.
  bool settled() const;

  // This rank's public copy x_hat_i, and the neighbours' (ring order: left,
  // right), for checkpoints and tests. Valid between rounds (after settle()
  // for rounds with a deadline).
  const std::vector<float>& own_copy() const;
  const std::vector<std::vector<float>>& neighbour_copies() const;
  const std::vector<int>& neighbours() const;
  // Restores the copies own_copy() and neighbour_copies() returned (from a
  // checkpoint), between rounds, and numbers the q of later rounds with a
  // deadline afresh: on every rank together, with no q in flight (a fresh
  // communicator, or after settle()). Throws InvalidArgument when their sizes
  // differ from this gossip's.
  void load_copies(const std::vector<float>& own, const std::vector<std::vector<float>>& theirs);

 private:
  struct State;
  std::shared_ptr<std::vector<std::byte>> encode_round(const TensorView& x, uint64_t round,
                                                       const ExecContext& ctx) const;
  WorkPtr synchronous_step(const TensorView& x, uint64_t round, const ExecContext& ctx);
  WorkPtr timed_step(const TensorView& x, uint64_t round, const ExecContext& ctx,
                     const ChocoRound& timing);
  CommunicatorPtr comm_;
  ChocoOptions options_;
  std::shared_ptr<State> state_;
};

}  // namespace relaxcc
