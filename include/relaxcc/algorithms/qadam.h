// qadam: 1-bit Adam / Q-Adam. The algorithm owns the optimizer step.
//
// Warmup (the first warmup_steps steps): every bucket of gradients is
// allreduced (average) at full precision and the step is Adam's, with bias
// correction, as relaxcc::Adam (L2 weight decay, or AdamW's decoupled one).
// Then the variance v is frozen (with its bias correction at the last
// warmup step) and each rank turns its gradient g into the momentum
//   m_r = beta1 m + (1 - beta1) (g + weight_decay p)   (AdamW: g alone)
// in its bucket, which is averaged by the compressed allreduce
// (relaxcc/relaxed/compressed_allreduce.h) with worker- and server-side
// error feedback per bucket (BucketFeedback): m becomes that average on
// every rank (the same bits everywhere; after synchronize() the gradients
// hold it, not the gradient), and
//   p -= lr (m / (1 - beta1^t)) / (sqrt(v_frozen) + eps)
// (AdamW: p -= lr weight_decay p first, as in every step).
// Codecs: sign (1 bit per value and one scale ||x|| / sqrt(len) per chunk:
// DeepSpeed's 1-bit Adam) or minmax with 8, 4, 2 or 1 bits (Bagua's QAdam:
// 8-bit min-max).
//
// State (state_dict): m and v of every parameter, keyed by its flat offset,
// and every error-feedback residual, so a checkpoint resumes bit for bit.
#pragma once

#include <map>
#include <vector>

#include "relaxcc/algorithm.h"
#include "relaxcc/algorithms/bucket_feedback.h"
#include "relaxcc/kernels/compressor.h"

namespace relaxcc::algorithms {

struct QAdamOptions {
  // Adam's hyperparameters (relaxcc::AdamOptions: lr 1e-3, betas 0.9 and
  // 0.999, eps 1e-8, no weight decay; the defaults of Bagua's
  // QAdamOptimizer and PyTorch's Adam). decoupled_weight_decay: AdamW.
  // Under relaxcc::torch::DistributedDataParallel the lr is the torch
  // optimizer's (set_learning_rate at construction and before every step), so a torch
  // scheduler drives it; the other fields stay these.
  AdamOptions adam;
  // Steps of full-precision Adam before the variance freezes (Bagua: 100;
  // DeepSpeed calls it freeze_step). >= 0.
  int warmup_steps = 100;
  // minmax (Bagua, 8 bits) or sign (DeepSpeed's 1-bit Adam; bits ignored).
  kernels::CompressorKind codec = kernels::CompressorKind::minmax;
  // minmax: 8, 4, 2 or 1.
  int bits = 8;
  // Elements per quantization chunk (relaxcc's codec default).
  int64_t chunk = 2048;
};

class QAdam final : public Algorithm {
 public:
  // Throws InvalidArgument for a codec other than minmax and sign, bits
  // outside 1..8 or not 8, 4, 2, 1, warmup_steps < 0, a chunk < 1, lr <= 0,
  // betas outside [0, 1) or eps <= 0.
  explicit QAdam(QAdamOptions options = {});
  std::string name() const override { return "qadam"; }
  AlgorithmCapabilities capabilities() const override;
  void init(const AlgorithmContext& ctx) override;
  WorkPtr on_bucket_ready(const StepInfo& step, int bucket, const TensorView& data) override;
  // Updates every gradient's partner parameter; the frontend's optimizer is
  // not used.
  void optimizer_step(const StepInfo& step, Optimizer& unused) override;
  // True at the first compressed step.
  bool need_reset(const StepInfo& step) const override {
    return step.step == options_.warmup_steps;
  }
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;
  // The Adam moments (the same on every rank).
  StateDict replicated_state_dict() const override;
  void load_replicated_state_dict(const StateDict& state) override;
  // Throws InvalidArgument for lr <= 0.
  void set_learning_rate(float lr) override;
  float lr() const { return options_.adam.lr; }

 private:
  bool warming_up(const StepInfo& step) const { return step.step < options_.warmup_steps; }
  std::vector<float>& slot(std::map<int64_t, std::vector<float>>& slots, int64_t key,
                           int64_t numel);

  QAdamOptions options_;
  AlgorithmContext ctx_;
  BucketFeedback feedback_;
  std::map<int64_t, std::vector<float>> m_, v_;  // keyed by the parameter's flat offset
  // The buckets dispatched since the last optimizer step: their memory
  // (which keeps it alive) and entries as dispatched, so that a plan
  // rebuild between a step's buckets and its optimizer step (the Reducer's
  // rebuild_after_first_step) loses none of them.
  struct Dispatched {
    int64_t step = 0;
    TensorView data;
    std::vector<BucketEntry> entries;
  };
  std::vector<Dispatched> dispatched_;
};

}  // namespace relaxcc::algorithms
