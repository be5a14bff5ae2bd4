#include "relaxcc/bucket_tuner.h"

#include <algorithm>
#include <cmath>

#include "relaxcc/errors.h"
#include "relaxcc/logging.h"

namespace relaxcc {

std::vector<int64_t> BucketTuner::candidate_caps() {
  std::vector<int64_t> caps;
  for (int i = 0; i < 13; ++i) caps.push_back((int64_t{64} << 10) << i);
  return caps;
}

BucketTuner::BucketTuner(BucketTunerOptions options) : options_(options) {
  RELAXCC_ENFORCE(options_.steps_per_cap >= 1 && options_.total_bytes > 0, InvalidArgument,
                  "BucketTuner: steps_per_cap >= 1 and total_bytes > 0");
  const auto caps = candidate_caps();
  for (int i : {0, 3, 6, 9, 12}) plan_.push_back(caps[i]);
  current_ = plan_[0];
}

int64_t BucketTuner::buckets(int64_t cap) const {
  return (options_.total_bytes + cap - 1) / cap;
}

bool BucketTuner::record(double seconds) {
  if (done_) return false;
  times_.push_back(seconds);
  // One settling step after every change, then steps_per_cap measured ones.
  if (static_cast<int>(times_.size()) < options_.steps_per_cap + 1) return false;
  std::vector<double> t(times_.begin() + 1, times_.end());
  std::sort(t.begin(), t.end());
  samples_.push_back({current_, t[t.size() / 2]});
  RELAXCC_LOG(info, "BucketTuner: cap ", current_, " bytes: median step ",
              samples_.back().seconds * 1e3, " ms");
  times_.clear();
  ++next_;
  if (next_ < plan_.size()) {
    current_ = plan_[next_];
    return true;
  }
  if (!fitted_) {
    fit();
    int64_t best = plan_[0];
    for (int64_t cap : candidate_caps())
      if (predict(cap) < predict(best)) best = cap;
    const bool measured = std::any_of(samples_.begin(), samples_.end(),
                                      [&](const Sample& s) { return s.cap == best; });
    RELAXCC_LOG(info, "BucketTuner: model T = ", a_, " + ", b_, " * buckets + ", c_,
                " * cap; predicted best cap ", best);
    if (!measured) {
      plan_.push_back(best);
      current_ = best;
      return true;
    }
  }
  const auto winner =
      std::min_element(samples_.begin(), samples_.end(),
                       [](const Sample& x, const Sample& y) { return x.seconds < y.seconds; });
  const bool changed = winner->cap != current_;
  current_ = winner->cap;
  done_ = true;
  RELAXCC_LOG(info, "BucketTuner: fixed the bucket cap at ", current_, " bytes (median step ",
              winner->seconds * 1e3, " ms)");
  return changed;
}

void BucketTuner::fit() {
  // Least squares for [1, buckets, cap] -> seconds (3x3 normal equations).
  double m[3][4] = {};
  for (const Sample& s : samples_) {
    const double x[3] = {1.0, static_cast<double>(buckets(s.cap)), static_cast<double>(s.cap)};
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) m[i][j] += x[i] * x[j];
      m[i][3] += x[i] * s.seconds;
    }
  }
  for (int col = 0; col < 3; ++col) {  // Gauss-Jordan with partial pivoting
    int pivot = col;
    for (int r = col + 1; r < 3; ++r)
      if (std::fabs(m[r][col]) > std::fabs(m[pivot][col])) pivot = r;
    std::swap(m[col], m[pivot]);
    if (std::fabs(m[col][col]) < 1e-30) continue;
    for (int r = 0; r < 3; ++r) {
      if (r == col) continue;
      const double f = m[r][col] / m[col][col];
      for (int j = col; j < 4; ++j) m[r][j] -= f * m[col][j];
    }
  }
  a_ = std::fabs(m[0][0]) > 1e-30 ? m[0][3] / m[0][0] : 0;
  b_ = std::fabs(m[1][1]) > 1e-30 ? m[1][3] / m[1][1] : 0;
  c_ = std::fabs(m[2][2]) > 1e-30 ? m[2][3] / m[2][2] : 0;
  fitted_ = true;
}

double BucketTuner::predict(int64_t cap) const {
  return a_ + b_ * static_cast<double>(buckets(cap)) + c_ * static_cast<double>(cap);
}

}  // namespace relaxcc
