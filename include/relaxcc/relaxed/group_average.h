// Group averaging (Moshpit SGD): in each round every rank averages with the
// ranks of its group only, and the groups change from round to round, so
// that averages spread without any global step.
//
// Grid groups. Ranks sit on a virtual grid of dims (M_0, ..., M_{d-1}),
// rank r at the mixed-radix coordinates of r (M_0 fastest). Round t averages
// within the groups along axis (t - 1) mod d: the ranks that share every
// other coordinate. With N = M_0 * ... * M_{d-1} ranks every rank holds the
// global average after d rounds, up to float rounding (exactly on dyadic
// data). Any N is supported: when N is below the grid's product the grid's
// last slices are partly empty and those groups are smaller (the grid must
// not have a slice with nobody in it: InvalidArgument).
//
// Random groups (random_groups = r > 0): each round splits the ranks, by a
// permutation drawn from (seed, round) that every rank draws alike, into r
// groups of near-equal size. With r equal groups the spread of the ranks'
// values around their mean contracts by about (r - 1) / (N - 1) in
// variance per round.
//
// Each group is a Communicator::group (no communication to make it) and
// averages with an allreduce (with stats, on the ring: relaxed_stats.h).
// With a deadline (fixed or adaptive) a group averages instead by
// exchanging tensors among its members (point_to_point rounds, (g-1)
// tensors out per rank: for the small groups of Moshpit), and a member
// whose tensor has not arrived by the deadline is left out of that rank's
// average; its late message is dropped by its round. Ranks that disagree on
// the grid or round get PeerMismatch (deadline path) or a mismatched group
// (allreduce path, PeerMismatch or timeout).
//
// (tag, round) names a call: calls in flight together on one communicator
// (two tensors averaged in the same round, say) need different tags, or
// their messages and groups would be shared.
#pragma once

#include <chrono>
#include <optional>
#include <vector>

#include "relaxcc/communicator.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/relaxed/adaptive_deadline.h"
#include "relaxcc/relaxed/relaxed_stats.h"

namespace relaxcc {

struct GroupAverageOptions : OpOptions {
  // Grid dims; empty: one axis of all ranks (every round the global average).
  std::vector<int> grid;
  uint64_t round = 1;     // >= 1
  int random_groups = 0;  // > 0: random groups instead of the grid
  uint64_t seed = 0;
  std::optional<std::chrono::steady_clock::time_point> deadline;
  AdaptiveDeadline* adaptive = nullptr;
  int tag = 30100;  // with a deadline or a codec: tags `tag` and `tag` + 1
  RelaxedStats* stats = nullptr;
  // Set: the members exchange compressed tensors (any compressor of
  // relaxcc/kernels/compressor.h; f32 only), by the exchange path, and each
  // mixes its own exact tensor with the others' decoded ones.
  std::optional<kernels::CompressorConfig> codec;
};

// The members of `rank`'s group in `options.round` (sorted). Throws
// InvalidArgument for a grid that does not fit `size` or random_groups
// outside [1, size].
std::vector<int> group_members(const GroupAverageOptions& options, int rank, int size);

// One round of group averaging of `x`, in place.
WorkPtr group_average(Communicator& comm, const TensorView& x, const ExecContext& ctx,
                      const GroupAverageOptions& options = {});

}  // namespace relaxcc
