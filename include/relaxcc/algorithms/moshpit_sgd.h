// moshpit_sgd: Moshpit SGD (Ryabinin, Gorbunov, Plokhotnyuk, Pekhimenko,
// NeurIPS 2021; learning-at-home/hivemind's Moshpit averaging). Weights, not
// gradients, travel.
//
// Every rank takes local steps; every local_steps steps each bucket's
// weights go through one round of group averaging on a virtual grid
// (relaxcc/relaxed/group_average.h): round k averages within the groups
// along grid axis (k - 1) mod d, so after d rounds of a full grid every rank
// holds the global average, without any global step. Rounds start as soon as
// a bucket's gradients are ready (WeightRounds, bucket_weights.h); the
// frontend's optimizer then applies this rank's own gradients to the
// averaged weights. With a deadline (adaptive by default: learned per peer
// from the fastest quorum of members, adaptive_deadline.h) a group member whose weights are
// late is left out of that rank's average, so a straggler does not hold its
// groups back.
//
// Bytes per communicating step and rank: (g - 1) models with a deadline
// (the members exchange tensors; g the group size), or an allreduce in the
// group (2 (g - 1) / g models) without one; with a codec, (g - 1) encoded
// models. Staleness: none; the ranks' models differ between full sweeps of
// the grid (evaluate after average_model()).
#pragma once

#include <optional>
#include <vector>

#include "relaxcc/algorithms/bucket_weights.h"
#include "relaxcc/algorithms/round_deadline.h"
#include "relaxcc/relaxed/group_average.h"

namespace relaxcc::algorithms {

struct MoshpitSgdOptions {
  // Steps between averaging rounds (1: a round every step, as the paper's
  // Moshpit SGD with one round per averaging step; relaxcc's default).
  int local_steps = 1;
  // Grid dims (M_0 fastest); empty: the most square two-axis grid for the
  // ranks, {m, ceil(n / m)} with m = round(sqrt(n)) (relaxcc's choice), one
  // axis when m = 1.
  std::vector<int> grid;
  // > 0: random groups of near-equal size instead of the grid
  // (group_average.h), drawn from (seed, round) alike on every rank.
  int random_groups = 0;
  uint64_t seed = 0;
  // Adaptive deadlines by default (relaxcc's choice: a straggler does not
  // hold its groups back).
  RoundDeadlineOptions deadline = [] {
    RoundDeadlineOptions d;
    d.adaptive = true;
    return d;
  }();
  // Set: members exchange compressed weights (f32 codecs of
  // relaxcc/kernels/compressor.h); each keeps its own exact weights.
  std::optional<kernels::CompressorConfig> codec;
  // Point-to-point tags: bucket b's rounds use tag + 2 b and tag + 2 b + 1.
  int tag = 33000;
};

class MoshpitSgd final : public WeightRounds {
 public:
  // Throws InvalidArgument for local_steps < 1, random_groups < 0, an
  // invalid codec or deadline. The grid is checked against the rank count
  // at init(): InvalidArgument for dims < 1 or a grid that does not fit.
  explicit MoshpitSgd(MoshpitSgdOptions options = {});
  std::string name() const override { return "moshpit_sgd"; }
  // The learned deadline of the rounds (null without one): its peers() say
  // how often each peer was left out.
  const AdaptiveDeadline* learned_deadline() const { return deadline_.adaptive(); }
  // The grid in use (after init).
  const std::vector<int>& grid() const { return grid_; }

 private:
  WorkPtr start_round(int bucket, uint64_t round, const TensorView& weights) override;
  void bound() override;
  GroupAverageOptions round_options(int bucket, uint64_t round) const;
  MoshpitSgdOptions options_;
  RoundDeadline deadline_;
  std::vector<int> grid_;
};

}  // namespace relaxcc::algorithms
