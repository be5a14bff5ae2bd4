// async_model_average: asynchronous model averaging as Bagua's
// AsyncModelAverageAlgorithm runs it (BaguaSys/bagua,
// bagua/torch_api/algorithms/async_model_average.py): training waits for
// the network at most a round's deadline or its staleness bound. Weights, not
// gradients, travel.
//
// Warmup: the first warmup_steps steps allreduce gradients (Bagua's
// warmup). Then every rank steps on its own gradients, and after each
// optimizer step every bucket's weights go to the bucket's
// AsyncModelAverager (relaxcc/relaxed/async_average.h): every
// interval_steps steps it snapshots them and starts averaging the snapshot
// at low priority, and the first step after that average completed applies
// it, x += avg - snapshot, keeping the local steps taken meanwhile. Each
// bucket averages on its own, so bucket b's average travels while bucket
// b + 1's is snapshot. A step waits for the average in flight when the next
// is due, which the default learned deadline bounds to milliseconds, and
// for one older than max_staleness_steps steps: a straggler slows the
// averages that need it, not the others' steps (async_average.h).
//
// Bytes per averaging step and rank: mode all, an allreduce of the model
// (2 (n - 1) / n models); gossip modes, one model per peer. Staleness: an
// average is applied 1 to max_staleness_steps steps after its snapshot.
// Runs are not reproducible bit for bit (when an average lands depends on
// timing): a checkpoint keeps the step counts only. Evaluate after
// average_model(), which stops the averaging and averages exactly.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "relaxcc/algorithms/bucket_weights.h"
#include "relaxcc/algorithms/round_deadline.h"
#include "relaxcc/relaxed/async_average.h"

namespace relaxcc::algorithms {

struct AsyncModelAverageOptions {
  // Steps between averages (Bagua's sync_interval_ms=500 is a time; relaxcc
  // counts steps: one per step).
  int64_t interval_steps = 1;
  // Bagua: warmup_steps=0.
  int warmup_steps = 0;
  // relaxcc's AsyncAverageOptions defaults (Bagua has no bound).
  int64_t max_staleness_steps = 8;
  // relaxcc's choice (Bagua averages with an allreduce, mode all, which
  // the slowest rank paces): rotating pairs with a learned deadline, so that
  // a straggler is left out of the rounds rather than setting everyone's pace.
  GossipMode mode = GossipMode::shift_one;
  // Gossip modes: each round's deadline for slow peers (round_deadline.h),
  // one learned deadline shared by the buckets' averagers; none: every
  // round waits for every peer.
  RoundDeadlineOptions deadline = [] {
    RoundDeadlineOptions d;
    d.adaptive = true;
    return d;
  }();
  std::chrono::milliseconds stop_timeout{10000};
  // Gossip modes: bucket b's averager uses tags tag + 2 b and tag + 2 b + 1,
  // whatever the plan: a plan of B buckets uses [tag, tag + 2 B), which
  // must lie within [0, max_p2p_tag()] (init() throws InvalidArgument
  // otherwise). Round numbers go on across the averagers of successive
  // plans (and across average_model()), so a late message of an earlier
  // averager's round is dropped by its round, never applied to a later one.
  int tag = 34000;
};

class AsyncModelAverage final : public Algorithm {
 public:
  // Throws InvalidArgument for interval_steps < 1, warmup_steps < 0,
  // max_staleness_steps < 1, or a deadline that is invalid or given with
  // mode all.
  explicit AsyncModelAverage(AsyncModelAverageOptions options = {});
  ~AsyncModelAverage() override;
  std::string name() const override { return "async_model_average"; }
  // The learned deadline of the rounds (null without one): its peers() say
  // how often each peer was left out.
  const AdaptiveDeadline* learned_deadline() const { return deadline_.adaptive(); }
  AlgorithmCapabilities capabilities() const override;
  void init(const AlgorithmContext& ctx) override;
  WorkPtr on_bucket_ready(const StepInfo& step, int bucket, const TensorView& data) override;
  // Warmup steps only.
  bool reduces_gradients(const StepInfo& step) const override {
    return step.step < options_.warmup_steps;
  }
  WorkPtr after_optimizer_step(const StepInfo& step) override;
  bool need_reset(const StepInfo& step) const override {
    return step.step == options_.warmup_steps;
  }
  // Stops every averager (each applies its average in flight if it came
  // within stop_timeout).
  void shutdown(std::chrono::milliseconds timeout) override;
  // Stops the averaging and replaces every parameter by its exact average
  // (collective). A later step starts new averagers.
  void average_model(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;
  // Summed over the buckets' averagers.
  AsyncAverageCounts counts() const;

 private:
  void stop_averagers();
  AsyncModelAverageOptions options_;
  RoundDeadline deadline_;
  AlgorithmContext ctx_;
  BucketWeights weights_;
  std::mutex lock_;  // the parameters' lock of the averagers
  std::vector<std::unique_ptr<AsyncModelAverager>> averagers_;
  uint64_t next_round_ = 1;      // the first round of the next averagers
  AsyncAverageCounts finished_;  // of stopped averagers
};

}  // namespace relaxcc::algorithms
