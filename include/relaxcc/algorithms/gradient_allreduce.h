// gradient_allreduce: the baseline data-parallel algorithm. Every bucket of
// gradients is allreduced as soon as it is complete (averaged by default).
// hierarchical: reduce within the node, allreduce across node leaders,
// broadcast within the node (the node layout from build_hierarchy, so
// RELAXCC_RANKS_PER_NODE emulates nodes on one machine).
#pragma once

#include "relaxcc/algorithm.h"
#include "relaxcc/topology.h"

namespace relaxcc::algorithms {

struct GradientAllreduceOptions {
  bool average = true;
  bool hierarchical = false;
};

class GradientAllreduce final : public Algorithm {
 public:
  explicit GradientAllreduce(GradientAllreduceOptions options = {}) : options_(options) {}
  std::string name() const override { return "gradient_allreduce"; }
  AlgorithmCapabilities capabilities() const override {
    AlgorithmCapabilities c;
    // Stateless: averages over the new view. Not hierarchical: a loss across
    // nodes leaves the node groups without it unpoisoned.
    c.survives_view_change = !options_.hierarchical;
    return c;
  }
  void init(const AlgorithmContext& ctx) override;
  WorkPtr on_bucket_ready(const StepInfo& step, int bucket, const TensorView& data) override;

 private:
  GradientAllreduceOptions options_;
  AlgorithmContext ctx_;
  HierarchicalComms hierarchy_;
  bool have_hierarchy_ = false;
};

}  // namespace relaxcc::algorithms
