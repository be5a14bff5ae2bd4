#include "relaxcc/collectives/shares.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "relaxcc/errors.h"
#include "src/collectives/ring_schedule.h"

namespace relaxcc {
namespace {

bool all_equal(const std::vector<double>& v) {
  return std::all_of(v.begin(), v.end(), [&](double x) { return x == v.front(); });
}

void check_rates(const std::vector<double>& rates, const char* what) {
  RELAXCC_ENFORCE(!rates.empty(), InvalidArgument, what, ": no link rates");
  for (size_t j = 0; j < rates.size(); ++j)
    RELAXCC_ENFORCE(std::isfinite(rates[j]) && rates[j] > 0, InvalidArgument, what,
                    ": the link rate of rank ", j, " is ", rates[j], " (expected > 0)");
}

// The smallest t in [lo, hi] with feasible(t), by bisection (feasible is
// monotone, holds at hi and not at lo), to the last bit: it stops once no
// double lies strictly between lo and hi (further steps could not move hi),
// after about 60 steps for the ranges here, and after 200 at most.
template <typename F>
double bisect(double lo, double hi, F feasible) {
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (mid <= lo || mid >= hi) break;
    (feasible(mid) ? hi : lo) = mid;
  }
  return hi;
}

}  // namespace

std::vector<double> owner_shares(const std::vector<double>& rates) {
  check_rates(rates, "owner_shares");
  const int n = static_cast<int>(rates.size());
  if (n <= 2 || all_equal(rates)) return std::vector<double>(rates.size(), 1.0 / n);
  const double top = *std::max_element(rates.begin(), rates.end());
  // Rank j's time is (1 + (n-2) f_j) / rate_j (in units of the tensor over
  // the fastest rate); at time t it may own at most (t rate_j - 1) / (n-2).
  const auto owned = [&](double t, int j) {
    return std::max(0.0, (t * rates[j] / top - 1) / (n - 2));
  };
  const auto total = [&](double t) {
    double sum = 0;
    for (int j = 0; j < n; ++j) sum += owned(t, j);
    return sum;
  };
  // At t = (n-1) top / slowest rate, the slowest rank alone may own it all.
  const double slowest = *std::min_element(rates.begin(), rates.end());
  const double t = bisect(0, (n - 1) * top / slowest + 1, [&](double x) { return total(x) >= 1; });
  std::vector<double> f(rates.size());
  for (int j = 0; j < n; ++j) f[j] = owned(t, j);
  const double sum = std::accumulate(f.begin(), f.end(), 0.0);
  for (double& x : f) x /= sum;
  return f;
}

std::vector<double> ring_shares(const std::vector<double>& rates) {
  check_rates(rates, "ring_shares");
  const int n = static_cast<int>(rates.size());
  const std::vector<double> equal(rates.size(), 1.0 / n);
  if (n <= 2 || all_equal(rates)) return equal;
  const double top = *std::max_element(rates.begin(), rates.end());
  std::vector<double> link(rates.size());  // link j -> j+1, relative to the fastest
  for (int j = 0; j < n; ++j) link[j] = std::min(rates[j], rates[(j + 1) % n]) / top;
  const auto slowest_link = [&](const std::vector<double>& f) {
    double m = 0;
    for (int j = 0; j < n; ++j) m = std::max(m, (2 - f[j] - f[(j + 1) % n]) / link[j]);
    return m;
  };
  // Link j at time m needs f_j + f_{j+1} >= d_j = 2 - m link_j. The least
  // total meeting every need: for each start f_0 (on a grid), the greedy
  // f_{j+1} = max(0, d_j - f_j) along the ring, the last need closed by f_{n-1}.
  std::vector<double> best;
  const auto cover = [&](double m) {
    constexpr int kGrid = 400;
    double least = 2;
    for (int g = 0; g <= kGrid; ++g) {
      std::vector<double> f(rates.size(), 0);
      f[0] = static_cast<double>(g) / kGrid;
      for (int j = 0; j + 1 < n; ++j) f[j + 1] = std::max(0.0, 2 - m * link[j] - f[j]);
      f[n - 1] = std::max(f[n - 1], 2 - m * link[n - 1] - f[0]);
      const double sum = std::accumulate(f.begin(), f.end(), 0.0);
      if (sum < least) {
        least = sum;
        best = f;
      }
    }
    return least <= 1;
  };
  const double m = bisect(0, slowest_link(equal), cover);
  cover(m);
  // Equal shares when they are (about) as fast.
  if (slowest_link(equal) <= m * 1.01) return equal;
  // What is left over goes by rate (more share never slows a ring link).
  double sum = std::accumulate(best.begin(), best.end(), 0.0);
  const double rate_sum = std::accumulate(rates.begin(), rates.end(), 0.0);
  for (int j = 0; j < n; ++j) best[j] += std::max(0.0, 1 - sum) * rates[j] / rate_sum;
  sum = std::accumulate(best.begin(), best.end(), 0.0);
  for (double& x : best) x /= sum;
  return best;
}

std::vector<int64_t> shard_counts(int64_t numel, int size, const std::vector<double>& shares) {
  if (shares.empty()) return balanced_chunks(numel, size);
  RELAXCC_ENFORCE(static_cast<int>(shares.size()) == size, InvalidArgument,
                  "shares: ", shares.size(), " weights for ", size,
                  " ranks (expected one per rank)");
  double sum = 0;
  for (size_t j = 0; j < shares.size(); ++j) {
    RELAXCC_ENFORCE(std::isfinite(shares[j]) && shares[j] >= 0, InvalidArgument,
                    "shares: the weight of rank ", j, " is ", shares[j],
                    " (expected finite and >= 0)");
    sum += shares[j];
  }
  RELAXCC_ENFORCE(sum > 0, InvalidArgument, "shares: every weight is zero");
  std::vector<int64_t> counts(shares.size());
  std::vector<std::pair<double, int>> rest(shares.size());
  int64_t given = 0;
  for (int j = 0; j < size; ++j) {
    const double exact = static_cast<double>(numel) * (shares[j] / sum);
    counts[j] = std::min<int64_t>(numel, static_cast<int64_t>(std::floor(exact)));
    given += counts[j];
    rest[j] = {exact - static_cast<double>(counts[j]), j};
  }
  std::stable_sort(rest.begin(), rest.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t k = 0; given < numel; k = (k + 1) % rest.size(), ++given) ++counts[rest[k].second];
  for (int j = size - 1; given > numel && j >= 0; --j) {
    const int64_t take = std::min(counts[j], given - numel);
    counts[j] -= take;
    given -= take;
  }
  return counts;
}

}  // namespace relaxcc
