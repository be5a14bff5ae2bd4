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
// one neighbour, 1/2). Rounds take no deadline: a neighbour's q that missed
// a round would leave the copies different for good. f32 tensors (the
// compressors' type). The object must outlive the Works of its rounds; one
// round at a time (InvalidArgument otherwise).
//
// A round moves the copies only once its whole exchange succeeded: a round
// that fails on this rank (PeerMismatch from a neighbour that compresses
// otherwise, after which the communicator stays usable; a transport error)
// leaves x and every copy on this rank as they were. Ranks whose round
// failed together stay in step; a neighbour whose own round succeeded (on 3
// ranks or more, when only some neighbours disagree) has applied this
// rank's q, so load_copies() from a checkpoint on every rank before going
// on.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "relaxcc/communicator.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/relaxed/relaxed_stats.h"

namespace relaxcc {

struct ChocoOptions {
  kernels::CompressorConfig codec;  // minmax 8-bit by default
  double gamma = 0.5;               // consensus step size, in (0, 1]
  int tag = 30300;                  // point-to-point tag of the rounds
  int priority = 0;
  RelaxedStats* stats = nullptr;
};

class ChocoGossip {
 public:
  // Public copies of `numel` elements, zero. Throws InvalidArgument for a
  // gamma outside (0, 1] or an invalid codec.
  ChocoGossip(CommunicatorPtr comm, int64_t numel, ChocoOptions options = {});

  // One round on `x` (f32, numel elements), in place. `round` >= 1 and
  // increasing.
  WorkPtr step(const TensorView& x, uint64_t round, const ExecContext& ctx);

  // This rank's public copy x_hat_i, and the neighbours' (ring order: left,
  // right), for checkpoints and tests. Valid between rounds.
  const std::vector<float>& own_copy() const;
  const std::vector<std::vector<float>>& neighbour_copies() const;
  const std::vector<int>& neighbours() const;
  // Restores the copies own_copy() and neighbour_copies() returned (from a
  // checkpoint), between rounds. Throws InvalidArgument when their sizes
  // differ from this gossip's.
  void load_copies(const std::vector<float>& own, const std::vector<std::vector<float>>& theirs);

 private:
  struct State;
  CommunicatorPtr comm_;
  ChocoOptions options_;
  std::shared_ptr<State> state_;
};

}  // namespace relaxcc
