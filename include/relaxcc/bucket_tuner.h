// BucketTuner: the automatic bucketing optimizer.
//
// It chooses the bucket cap from measured step times. Candidates are the 13
// caps 64 KiB * 2^i, i = 0..12 (64 KiB to 256 MiB). It measures 5 of them
// (i = 0, 3, 6, 9, 12): each for `steps_per_cap` steps after one settling
// step, taking the median of the maximum step time over ranks. It then fits
// the model
//     T(cap) = a + b * buckets(cap) + c * cap
// by least squares: b is the per-bucket cost (latency, launch), c the
// communication that cannot overlap (the last bucket's transfer, the wait
// for the first one to fill), a everything else. The cap that minimizes the
// model is measured too, and the tuner fixes whichever measured fastest.
// This is a model fit, not Bayesian optimisation.
//
// Every decision derives from step times reduced (max) across ranks, so all
// ranks agree on every cap without extra messages. Decisions are logged at
// INFO. Algorithms whose math depends on bucket boundaries are left alone
// (the Reducer does not start a tuner for them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace relaxcc {

struct BucketTunerOptions {
  int steps_per_cap = 5;
  int64_t total_bytes = 0;  // bytes of all gradients (for bucket counts)
};

class BucketTuner {
 public:
  explicit BucketTuner(BucketTunerOptions options);

  static std::vector<int64_t> candidate_caps();

  // The cap to run the next step with.
  int64_t current_cap() const { return current_; }
  bool done() const { return done_; }
  // Records one step's time (seconds, already the maximum over ranks).
  // Returns true when the cap for the next step changed.
  bool record(double step_seconds);

  struct Sample {
    int64_t cap;
    double seconds;  // median
  };
  const std::vector<Sample>& samples() const { return samples_; }
  // The model's prediction for a cap (valid once fitted).
  double predict(int64_t cap) const;

 private:
  void fit();
  int64_t buckets(int64_t cap) const;

  BucketTunerOptions options_;
  std::vector<int64_t> plan_;  // caps still to measure
  size_t next_ = 0;
  int64_t current_ = 0;
  std::vector<double> times_;  // steps at the current cap
  std::vector<Sample> samples_;
  double a_ = 0, b_ = 0, c_ = 0;
  bool fitted_ = false;
  bool done_ = false;
};

}  // namespace relaxcc
