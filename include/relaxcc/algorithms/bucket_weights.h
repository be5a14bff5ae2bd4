// BucketWeights: the parameters behind each gradient bucket (every
// gradient's partner, TensorSpec::partner), gathered into one flat f32
// buffer per bucket with the bucket's layout, for the algorithms that move
// weights bucket by bucket (decentralized_sgd, moshpit_sgd, ...): bucket b's
// weights start travelling as soon as its gradients are ready, while
// backward computes the next bucket's gradients.
//
// A buffer has the gradient bucket's layout: tensor entry e of bucket b sits
// at the same offset in weights(b) as its gradient in the bucket (padding
// is zero and stays out of every copy). Buffers are shared-owned, so a Work
// that holds view(b) keeps its memory alive.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "relaxcc/algorithm.h"

namespace relaxcc::algorithms {

class BucketWeights {
 public:
  // Binds to ctx.plan. Throws InvalidArgument, naming `who`, for a bucket
  // gradient without a partner parameter or one that is not f32 on the host.
  void rebind(const AlgorithmContext& ctx, const std::string& who);
  int buckets() const { return static_cast<int>(buffers_.size()); }
  // Bucket b's buffer, as a tensor that keeps its memory alive.
  TensorView view(int bucket) const;
  std::vector<float>& buffer(int bucket) { return *buffers_[static_cast<size_t>(bucket)]; }
  // Parameters -> buffer, and buffer -> parameters.
  void gather(int bucket);
  void scatter(int bucket) const;
  // True when bucket b has the same entries as it had before the last
  // rebind (per-bucket state may then carry over as it is).
  bool unchanged(int bucket) const;
  // Elements of weights in bucket b (padding excluded).
  int64_t weights(int bucket) const;

 private:
  AlgorithmContext ctx_;
  std::vector<std::shared_ptr<std::vector<float>>> buffers_;
  std::vector<std::vector<BucketEntry>> entries_, previous_;
};

// The registered parameter tensors in registration order, as one flat f32
// vector (cocktail_sgd, diloco): tensors[i] starts at offsets[i].
struct FlatParameters {
  std::vector<int> tensors;
  std::vector<int64_t> offsets;
  int64_t numel = 0;
  // Throws InvalidArgument, naming `who`, for a parameter that is not f32 on
  // the host.
  void bind(const AlgorithmContext& ctx, const std::string& who);
};

// Replaces every registered parameter by its exact average over ctx.comm
// (one allreduce per tensor, waited for together with `timeout`): the final
// exact average before evaluation of the algorithms that leave ranks with
// different models. Collective.
void average_parameters(const AlgorithmContext& ctx, const std::string& label,
                        std::chrono::milliseconds timeout);
// What is left of `timeout` since `start`, in whole milliseconds rounded up
// (never below 0); a negative timeout (each wait's default) stays as it is.
std::chrono::milliseconds timeout_left(std::chrono::milliseconds timeout,
                                       std::chrono::steady_clock::time_point start);

// The shape shared by the algorithms that mix weights bucket by bucket
// (decentralized_sgd, low_precision_decentralized_sgd, moshpit_sgd): every
// `interval` steps, bucket b's weights (its gradients' partner parameters,
// as they are at the start of the step) are gathered when its gradients are
// ready and start_round() starts their mixing at once, so bucket b's round
// travels while backward computes bucket b + 1; the Reducer waits for the
// rounds in synchronize(); before the optimizer step the mixed weights
// replace the parameters, and the frontend's optimizer applies this rank's
// own gradients:
//   x_{t+1} = Mix_t(x_t) - lr * g_r(x_t).
// Other steps are local steps. Round k >= 1 is the k-th communicating step,
// derived from the step number, so a resumed run continues the sequence.
class WeightRounds : public Algorithm {
 public:
  AlgorithmCapabilities capabilities() const override;
  void init(const AlgorithmContext& ctx) override;
  WorkPtr on_bucket_ready(const StepInfo& step, int bucket, const TensorView& data) override;
  void before_optimizer_step(const StepInfo& step) override;
  // The exact average of every parameter over the ranks, for evaluation
  // (collective; every rank calls it between steps).
  void average_model(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));
  // Peers left out of rounds by a deadline (Work::missing_peers), summed
  // over rounds and buckets.
  int64_t missing_peers() const { return missing_; }

 protected:
  // `who` names the module in errors; throws InvalidArgument for an
  // interval < 1.
  WeightRounds(std::string who, int interval);
  // Starts bucket `bucket`'s round `round` on `weights`, in place.
  virtual WorkPtr start_round(int bucket, uint64_t round, const TensorView& weights) = 0;
  // After init() bound the weights of a (new) plan.
  virtual void bound() {}
  const AlgorithmContext& context() const { return ctx_; }
  BucketWeights& bucket_weights() { return weights_; }

 private:
  bool communicates(const StepInfo& step) const { return step.step % interval_ == 0; }
  std::string who_;
  int interval_;
  AlgorithmContext ctx_;
  BucketWeights weights_;
  std::vector<WorkPtr> rounds_;
  int64_t missing_ = 0;
};

}  // namespace relaxcc::algorithms
