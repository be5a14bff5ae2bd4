// local_sgd: every rank steps on its own gradients and the models are
// averaged every `period` steps (weights, not gradients, travel). With
// warmup_steps, the first steps run as gradient allreduce (post-local SGD).
// Parameters are the tensors registered with role parameter.
#pragma once

#include "relaxcc/algorithm.h"

namespace relaxcc::algorithms {

struct LocalSgdOptions {
  int period = 4;
  int warmup_steps = 0;
};

class LocalSgd final : public Algorithm {
 public:
  explicit LocalSgd(LocalSgdOptions options = {});
  std::string name() const override { return "local_sgd"; }
  AlgorithmCapabilities capabilities() const override;
  void init(const AlgorithmContext& ctx) override { ctx_ = ctx; }
  WorkPtr on_bucket_ready(const StepInfo& step, int bucket, const TensorView& data) override;
  // Warmup steps only.
  bool reduces_gradients(const StepInfo& step) const override { return warming_up(step); }
  WorkPtr after_optimizer_step(const StepInfo& step) override;
  bool need_reset(const StepInfo& step) const override {
    return step.step == options_.warmup_steps;
  }
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;
  int64_t averages() const { return averages_; }

 private:
  bool warming_up(const StepInfo& step) const { return step.step < options_.warmup_steps; }
  LocalSgdOptions options_;
  AlgorithmContext ctx_;
  int64_t averages_ = 0;
};

}  // namespace relaxcc::algorithms
