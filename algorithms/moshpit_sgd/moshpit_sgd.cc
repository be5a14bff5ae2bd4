#include "relaxcc/algorithms/moshpit_sgd.h"

#include <cmath>

#include "relaxcc/errors.h"

namespace relaxcc::algorithms {

MoshpitSgd::MoshpitSgd(MoshpitSgdOptions options)
    : WeightRounds("moshpit_sgd", options.local_steps),
      options_(std::move(options)),
      deadline_(options_.deadline, "moshpit_sgd") {
  RELAXCC_ENFORCE(options_.random_groups >= 0, InvalidArgument,
                  "moshpit_sgd: random_groups must be >= 0, got ", options_.random_groups);
  for (int m : options_.grid)
    RELAXCC_ENFORCE(m >= 1, InvalidArgument, "moshpit_sgd: grid dims must be >= 1, got ", m);
  if (options_.codec) options_.codec->validate();
}

void MoshpitSgd::bound() {
  const int n = context().comm->size();
  grid_ = options_.grid;
  if (grid_.empty()) {
    const int m = static_cast<int>(std::lround(std::sqrt(static_cast<double>(n))));
    grid_ = m <= 1 ? std::vector<int>{n} : std::vector<int>{m, (n + m - 1) / m};
  }
  // Every axis of the grid (and the random groups) against the rank count.
  const int axes = options_.random_groups > 0 ? 1 : static_cast<int>(grid_.size());
  for (int k = 1; k <= axes; ++k) {
    try {
      group_members(round_options(0, static_cast<uint64_t>(k)), context().comm->rank(), n);
    } catch (const InvalidArgument& e) {
      RELAXCC_THROW(InvalidArgument, "moshpit_sgd: rank ", context().comm->rank(), " of ", n,
                    ": grid or groups do not fit the rank count: ", e.what());
    }
  }
}

GroupAverageOptions MoshpitSgd::round_options(int bucket, uint64_t round) const {
  GroupAverageOptions o;
  o.grid = grid_;
  o.round = round;
  o.random_groups = options_.random_groups;
  o.seed = options_.seed;
  o.codec = options_.codec;
  o.tag = options_.tag + 2 * bucket;
  o.label = "moshpit_sgd bucket " + std::to_string(bucket);
  return o;
}

WorkPtr MoshpitSgd::start_round(int bucket, uint64_t round, const TensorView& weights) {
  GroupAverageOptions o = round_options(bucket, round);
  deadline_.apply(o);
  return group_average(*context().comm, weights, context().exec, o);
}

}  // namespace relaxcc::algorithms
