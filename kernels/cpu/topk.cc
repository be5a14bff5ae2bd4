#include "topk.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "cpu_kernels.h"
#include "quantize.h"
#include "relaxcc/errors.h"
#include "relaxcc/thread_pool.h"

namespace relaxcc::kernels::cpu {

namespace {

struct Candidates {
  std::vector<uint32_t> idx;
  std::vector<float> val;
  int64_t bad = -1;  // first non-finite index seen
};

void scan_scalar(const float* x, int64_t begin, int64_t end, float t, Candidates& out) {
  for (int64_t i = begin; i < end; ++i) {
    if (!std::isfinite(x[i])) {
      if (out.bad < 0) out.bad = i;
      continue;
    }
    if (std::fabs(x[i]) >= t) {
      out.idx.push_back(static_cast<uint32_t>(i));
      out.val.push_back(x[i]);
    }
  }
}

// Compares 32 magnitudes per iteration; at low density most masks are empty.
__attribute__((target("avx2"))) void scan_avx2(const float* x, int64_t begin, int64_t end, float t,
                                               Candidates& out) {
  const __m256 vt = _mm256_set1_ps(t), inf = _mm256_set1_ps(INFINITY);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  int64_t i = begin;
  for (; i + 32 <= end; i += 32) {
    uint32_t bits = 0, bad = 0;
    for (int k = 0; k < 4; ++k) {
      const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i + 8 * k), abs_mask);
      bits |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a, vt, _CMP_GE_OQ)))
              << (8 * k);
      bad |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a, inf, _CMP_NLT_UQ)));
    }
    if (bad != 0) {
      scan_scalar(x, i, i + 32, t, out);
      continue;
    }
    while (bits != 0) {
      const int64_t j = i + __builtin_ctz(bits);
      out.idx.push_back(static_cast<uint32_t>(j));
      out.val.push_back(x[j]);
      bits &= bits - 1;
    }
  }
  scan_scalar(x, i, end, t, out);
}

void scan(const float* x, int64_t begin, int64_t end, float t, Candidates& out) {
  if (has_avx2())
    scan_avx2(x, begin, end, t, out);
  else
    scan_scalar(x, begin, end, t, out);
}

// Candidates with |x| >= t over [0, n), in index order, split over the pool.
Candidates candidates(const float* x, int64_t n, float t, const ExecContext& ctx,
                      int64_t expected) {
  const int parts = ctx.pool ? ctx.pool->num_threads() : 1;
  Candidates out;
  if (parts == 1 || n < (1 << 20)) {
    out.idx.reserve(static_cast<size_t>(expected));
    out.val.reserve(static_cast<size_t>(expected));
    scan(x, 0, n, t, out);
  } else {
    std::vector<Candidates> pieces(parts);
    ctx.pool->parallel_for(parts, 1, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        pieces[p].idx.reserve(static_cast<size_t>(expected / parts + 1024));
        pieces[p].val.reserve(static_cast<size_t>(expected / parts + 1024));
        scan(x, n * p / parts, n * (p + 1) / parts, t, pieces[p]);
      }
    });
    size_t total = 0;
    for (const auto& p : pieces) total += p.idx.size();
    out.idx.reserve(total);
    out.val.reserve(total);
    for (const auto& p : pieces) {
      out.idx.insert(out.idx.end(), p.idx.begin(), p.idx.end());
      out.val.insert(out.val.end(), p.val.begin(), p.val.end());
      if (out.bad < 0) out.bad = p.bad;
    }
  }
  if (out.bad >= 0)
    RELAXCC_THROW(InvalidArgument, "topk: element ", out.bad, " is ", x[out.bad],
                  "; compressors take finite values (check for overflow first)");
  return out;
}

float kth_largest(std::vector<float> mags, int64_t k) {
  std::nth_element(mags.begin(), mags.begin() + (k - 1), mags.end(), std::greater<float>());
  return mags[k - 1];
}

// Keeps exactly k of the ascending candidates: all above the k-th magnitude,
// then the lowest-index ties.
Selection trim(const Candidates& cand, int64_t k) {
  std::vector<float> mags(cand.val.size());
  for (size_t j = 0; j < mags.size(); ++j) mags[j] = std::fabs(cand.val[j]);
  const float tk = kth_largest(mags, k);
  int64_t ties_left = k;
  for (float m : mags) ties_left -= m > tk;
  Selection out;
  out.indices.reserve(static_cast<size_t>(k));
  out.values.reserve(static_cast<size_t>(k));
  for (size_t j = 0; j < mags.size(); ++j) {
    if (mags[j] > tk || (mags[j] == tk && ties_left-- > 0)) {
      out.indices.push_back(cand.idx[j]);
      out.values.push_back(cand.val[j]);
    }
  }
  return out;
}

__attribute__((target("avx2"))) int64_t first_bad_avx2(const float* x, int64_t begin, int64_t end) {
  const __m256 inf = _mm256_set1_ps(INFINITY);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  int64_t i = begin;
  for (; i + 32 <= end; i += 32) {
    __m256 bad = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k)
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + i + 8 * k), abs_mask),
                                            inf, _CMP_NLT_UQ));
    if (_mm256_movemask_ps(bad) != 0) break;
  }
  for (; i < end; ++i)
    if (!std::isfinite(x[i])) return i;
  return -1;
}

int64_t first_bad(const float* x, int64_t begin, int64_t end) {
  if (has_avx2()) return first_bad_avx2(x, begin, end);
  for (int64_t i = begin; i < end; ++i)
    if (!std::isfinite(x[i])) return i;
  return -1;
}

}  // namespace

int64_t first_non_finite(const float* x, int64_t n, const ExecContext& ctx) {
  const int parts = ctx.pool ? ctx.pool->num_threads() : 1;
  if (parts == 1 || n < (1 << 20)) return first_bad(x, 0, n);
  std::vector<int64_t> found(parts, -1);
  ctx.pool->parallel_for(parts, 1, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) found[p] = first_bad(x, n * p / parts, n * (p + 1) / parts);
  });
  for (int64_t f : found)
    if (f >= 0) return f;
  return -1;
}

Selection topk(const float* x, int64_t n, int64_t k, bool approximate, const ExecContext& ctx) {
  if (k <= 0) return {};
  if (k >= n) return trim(candidates(x, n, 0.0f, ctx, n), n);
  if (approximate && n >= (1 << 16)) {
    // Threshold from a sample of 256 evenly spaced runs of 256 elements
    // (sequential reads), aimed at ~1.5 k candidates. A threshold that
    // turns out too high is lowered and the scan repeated, so the count is
    // always exact and recall only depends on ties.
    constexpr int64_t kRuns = 256, kRun = 256;
    const int64_t m = kRuns * kRun;
    std::vector<float> sample(static_cast<size_t>(m));
    for (int64_t r = 0; r < kRuns; ++r) {
      const int64_t start = r * (n - kRun) / (kRuns - 1);
      for (int64_t j = 0; j < kRun; ++j) sample[r * kRun + j] = std::fabs(x[start + j]);
    }
    int64_t rank = std::min<int64_t>(m, (k * m * 3) / (2 * n) + 16);
    for (int attempt = 0; attempt < 4; ++attempt) {
      std::nth_element(sample.begin(), sample.begin() + (rank - 1), sample.end(),
                       std::greater<float>());
      const Candidates cand = candidates(x, n, sample[rank - 1], ctx, rank * n / m + 1024);
      if (static_cast<int64_t>(cand.idx.size()) >= k) return trim(cand, k);
      if (rank == m) break;
      rank = std::min(m, rank * 4);  // too few above the threshold: lower it
    }
  }
  const int64_t bad = first_non_finite(x, n, ctx);
  if (bad >= 0)
    RELAXCC_THROW(InvalidArgument, "topk: element ", bad, " is ", x[bad],
                  "; compressors take finite values (check for overflow first)");
  std::vector<float> mags(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) mags[i] = std::fabs(x[i]);
  return trim(candidates(x, n, kth_largest(std::move(mags), k), ctx, k + 1024), k);
}

}  // namespace relaxcc::kernels::cpu
