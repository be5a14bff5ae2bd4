// AdaptiveDeadline: how long a relaxed round (gossip, group averaging,
// asynchronous averaging) waits for its peers, learned from when their
// messages arrived (hivemind issue #676 asks for exactly this).
//
// The deadline is the median of the last `window` arrival times plus k times
// their median absolute deviation, clamped to [floor, cap]; before
// min_samples arrivals it is `cap`. An arrival time is measured from the
// start of this rank's round to the arrival of one peer's whole message; a
// peer left out adds no sample (it would only pull the deadline towards the
// straggler). The rounds apply it to the start of a peer's message: a peer
// whose message has begun to arrive by the deadline is waited for until
// `cap` (peer_mixing) and sampled at its whole arrival, so one deadline
// learned across tensors of different sizes leaves out late peers, not large
// tensors.
// Thread-safe: rounds observe from the engine thread while the caller reads
// current().
#pragma once

#include <chrono>
#include <mutex>
#include <vector>

namespace relaxcc {

struct AdaptiveDeadlineOptions {
  double k = 3.0;
  // At least the skew between healthy ranks' round starts: on a fast link
  // the arrivals crowd near zero (half the peers start first), median + k
  // MAD falls below that skew and healthy peers are left out (2 ms left
  // them out of about a fifth of the rounds in relaxcc-bench's straggler
  // runs, unshaped; docs/benchmarks.md).
  std::chrono::microseconds floor{10000};
  std::chrono::microseconds cap{std::chrono::seconds(2)};
  int window = 64;
  int min_samples = 8;
};

class AdaptiveDeadline {
 public:
  // Throws InvalidArgument for k < 0, floor < 0, cap < floor, window < 1 or
  // min_samples outside [1, window].
  explicit AdaptiveDeadline(AdaptiveDeadlineOptions options = {});

  std::chrono::microseconds current() const;
  void observe(std::chrono::microseconds arrival);
  const AdaptiveDeadlineOptions& options() const noexcept { return options_; }

 private:
  AdaptiveDeadlineOptions options_;
  mutable std::mutex mutex_;
  std::vector<int64_t> samples_;  // ring buffer of the last `window` arrivals, in us
  size_t next_ = 0;
};

}  // namespace relaxcc
