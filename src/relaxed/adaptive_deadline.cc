#include "relaxcc/relaxed/adaptive_deadline.h"

#include <algorithm>
#include <cmath>

#include "relaxcc/errors.h"

namespace relaxcc {

namespace {
int64_t median(std::vector<int64_t> v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  return v[mid];
}
}  // namespace

AdaptiveDeadline::AdaptiveDeadline(AdaptiveDeadlineOptions options) : options_(options) {
  RELAXCC_ENFORCE(options_.k >= 0, InvalidArgument, "AdaptiveDeadline: k = ", options_.k,
                  ", expected >= 0");
  RELAXCC_ENFORCE(options_.floor.count() >= 0 && options_.cap >= options_.floor, InvalidArgument,
                  "AdaptiveDeadline: expected 0 <= floor <= cap, got floor ",
                  options_.floor.count(), " us, cap ", options_.cap.count(), " us");
  RELAXCC_ENFORCE(
      options_.window >= 1 && options_.min_samples >= 1 && options_.min_samples <= options_.window,
      InvalidArgument, "AdaptiveDeadline: expected 1 <= min_samples (", options_.min_samples,
      ") <= window (", options_.window, ")");
}

void AdaptiveDeadline::observe(std::chrono::microseconds arrival) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t us = std::max<int64_t>(arrival.count(), 0);
  if (samples_.size() < static_cast<size_t>(options_.window)) {
    samples_.push_back(us);
  } else {
    samples_[next_] = us;
    next_ = (next_ + 1) % samples_.size();
  }
}

std::chrono::microseconds AdaptiveDeadline::current() const {
  std::vector<int64_t> samples;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (samples_.size() < static_cast<size_t>(options_.min_samples)) return options_.cap;
    samples = samples_;
  }
  const int64_t m = median(samples);
  std::vector<int64_t> deviation(samples.size());
  for (size_t i = 0; i < samples.size(); ++i) deviation[i] = std::llabs(samples[i] - m);
  const double value = static_cast<double>(m) + options_.k * static_cast<double>(median(deviation));
  const auto us = static_cast<int64_t>(std::ceil(value));
  return std::chrono::microseconds(
      std::clamp<int64_t>(us, options_.floor.count(), options_.cap.count()));
}

}  // namespace relaxcc
