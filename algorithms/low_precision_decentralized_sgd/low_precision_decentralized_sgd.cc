#include "relaxcc/algorithms/low_precision_decentralized_sgd.h"

#include <algorithm>

#include "relaxcc/errors.h"

namespace relaxcc::algorithms {

LowPrecisionDecentralizedSgd::LowPrecisionDecentralizedSgd(
    LowPrecisionDecentralizedSgdOptions options)
    : WeightRounds("low_precision_decentralized_sgd", options.communication_interval),
      options_(options),
      deadline_(options.deadline, "low_precision_decentralized_sgd") {
  RELAXCC_ENFORCE(options_.gamma > 0 && options_.gamma <= 1, InvalidArgument,
                  "low_precision_decentralized_sgd: gamma must be in (0, 1], got ", options_.gamma);
  options_.codec.validate();
}

AlgorithmCapabilities LowPrecisionDecentralizedSgd::capabilities() const {
  AlgorithmCapabilities c = WeightRounds::capabilities();
  c.depends_on_bucket_boundaries = true;  // public copies per bucket
  return c;
}

void LowPrecisionDecentralizedSgd::bound() {
  BucketWeights& w = bucket_weights();
  std::vector<std::unique_ptr<ChocoGossip>> kept = std::move(gossip_);
  gossip_.clear();
  for (int b = 0; b < w.buckets(); ++b) {
    const size_t i = static_cast<size_t>(b);
    if (i < kept.size() && w.unchanged(b)) {
      gossip_.push_back(std::move(kept[i]));
      continue;
    }
    // A bucket that changes restarts its copies, and its q numbers: the
    // old ones still in flight are taken first (the rebuild is collective).
    if (i < kept.size()) kept[i]->settle(std::chrono::milliseconds(context().tunables.timeout_ms));
    ChocoOptions o;
    o.codec = options_.codec;
    o.gamma = options_.gamma;
    o.tag = options_.tag + 2 * b;
    gossip_.push_back(
        std::make_unique<ChocoGossip>(context().comm, static_cast<int64_t>(w.buffer(b).size()), o));
  }
}

WorkPtr LowPrecisionDecentralizedSgd::start_round(int bucket, uint64_t round,
                                                  const TensorView& weights) {
  ChocoRound timing;
  deadline_.apply(timing);
  return gossip_[static_cast<size_t>(bucket)]->step(weights, round, context().exec, timing);
}

void LowPrecisionDecentralizedSgd::drain(std::chrono::milliseconds timeout) {
  WeightRounds::drain(timeout);
  for (auto& g : gossip_) g->settle(timeout);
}

void LowPrecisionDecentralizedSgd::shutdown(std::chrono::milliseconds timeout) {
  if (context().comm == nullptr || !context().comm->poisoned()) drain(timeout);
}

StateDict LowPrecisionDecentralizedSgd::state_dict() const {
  for (const auto& g : gossip_)
    RELAXCC_ENFORCE(g->settled(), InvalidArgument,
                    "low_precision_decentralized_sgd: state_dict after rounds with a deadline "
                    "needs drain() first");
  StateDict sd;
  sd.put_int("low_precision_decentralized_sgd/buckets", static_cast<int64_t>(gossip_.size()));
  for (size_t b = 0; b < gossip_.size(); ++b) {
    const std::string key = "low_precision_decentralized_sgd/bucket" + std::to_string(b);
    sd.put_floats(key + "/own", gossip_[b]->own_copy());
    const auto& theirs = gossip_[b]->neighbour_copies();
    for (size_t j = 0; j < theirs.size(); ++j)
      sd.put_floats(key + "/neighbour" + std::to_string(j), theirs[j]);
  }
  return sd;
}

void LowPrecisionDecentralizedSgd::load_state_dict(const StateDict& state) {
  const int64_t saved = state.get_int("low_precision_decentralized_sgd/buckets");
  RELAXCC_ENFORCE_EQ(saved, static_cast<int64_t>(gossip_.size()), InvalidArgument,
                     "low_precision_decentralized_sgd: the checkpoint's bucket count");
  for (size_t b = 0; b < gossip_.size(); ++b) {
    const std::string key = "low_precision_decentralized_sgd/bucket" + std::to_string(b);
    std::vector<std::vector<float>> theirs(gossip_[b]->neighbour_copies().size());
    for (size_t j = 0; j < theirs.size(); ++j)
      theirs[j] = state.get_floats(key + "/neighbour" + std::to_string(j));
    gossip_[b]->load_copies(state.get_floats(key + "/own"), theirs);
  }
}

}  // namespace relaxcc::algorithms
