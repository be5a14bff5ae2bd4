// RoundDeadline: how long a relaxed round of an algorithm module waits for
// slow peers (gossip.h, group_average.h): not at all limited (the default),
// a fixed time from each round's start, or an AdaptiveDeadline learned
// per peer from the arrivals of the fastest quorum of peers, with stragglers
// left out until they are on time (adaptive_deadline.h).
#pragma once

#include <chrono>
#include <memory>

#include "relaxcc/errors.h"
#include "relaxcc/relaxed/adaptive_deadline.h"

namespace relaxcc::algorithms {

struct RoundDeadlineOptions {
  // > 0: each round goes on without the peers whose tensor has not arrived
  // this long after its start.
  std::chrono::microseconds fixed{0};
  // Learned deadlines (takes precedence over `fixed`).
  bool adaptive = false;
  AdaptiveDeadlineOptions adaptive_options;
};

class RoundDeadline {
 public:
  // Throws InvalidArgument, naming `who`, for a negative fixed deadline or
  // bad adaptive options.
  RoundDeadline(const RoundDeadlineOptions& options, const char* who) : options_(options) {
    RELAXCC_ENFORCE(options.fixed.count() >= 0, InvalidArgument, who,
                    ": deadline.fixed must be >= 0 us, got ", options.fixed.count());
    if (options.adaptive) adaptive_ = std::make_unique<AdaptiveDeadline>(options.adaptive_options);
  }
  bool enabled() const { return adaptive_ != nullptr || options_.fixed.count() > 0; }
  // Sets the deadline of a round that starts now on `o` (GossipOptions,
  // GroupAverageOptions, ChocoRound).
  template <typename RoundOptions>
  void apply(RoundOptions& o) const {
    if (adaptive_) {
      o.adaptive = adaptive_.get();
    } else if (options_.fixed.count() > 0) {
      o.deadline = std::chrono::steady_clock::now() + options_.fixed;
    }
  }
  // The learned deadline (thread-safe; null without one).
  AdaptiveDeadline* adaptive() const { return adaptive_.get(); }

 private:
  RoundDeadlineOptions options_;
  std::unique_ptr<AdaptiveDeadline> adaptive_;
};

}  // namespace relaxcc::algorithms
