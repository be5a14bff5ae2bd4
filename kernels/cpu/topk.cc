#include "topk.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "quantize.h"
#include "relaxcc/errors.h"
#include "relaxcc/thread_pool.h"

namespace relaxcc::kernels::cpu {

namespace {

// Appends the indices in [begin, end) with |x| >= t, in order.
void scan_scalar(const float* x, int64_t begin, int64_t end, float t, std::vector<uint32_t>& out) {
  for (int64_t i = begin; i < end; ++i)
    if (std::fabs(x[i]) >= t) out.push_back(static_cast<uint32_t>(i));
}

__attribute__((target("avx2"))) void scan_avx2(const float* x, int64_t begin, int64_t end, float t,
                                               std::vector<uint32_t>& out) {
  const __m256 vt = _mm256_set1_ps(t);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  int64_t i = begin;
  for (; i + 32 <= end; i += 32) {
    uint32_t bits = 0;
    for (int k = 0; k < 4; ++k) {
      const __m256 v = _mm256_and_ps(_mm256_loadu_ps(x + i + 8 * k), abs_mask);
      bits |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(v, vt, _CMP_GE_OQ))) << (8 * k);
    }
    while (bits != 0) {
      out.push_back(static_cast<uint32_t>(i + __builtin_ctz(bits)));
      bits &= bits - 1;
    }
  }
  scan_scalar(x, i, end, t, out);
}

void scan(const float* x, int64_t begin, int64_t end, float t, std::vector<uint32_t>& out) {
  if (has_avx2()) scan_avx2(x, begin, end, t, out);
  else scan_scalar(x, begin, end, t, out);
}

// Candidates with |x| >= t over [0, n), in index order, split over the pool.
std::vector<uint32_t> candidates(const float* x, int64_t n, float t, const ExecContext& ctx) {
  const int parts = ctx.pool ? ctx.pool->num_threads() : 1;
  if (parts == 1 || n < (1 << 20)) {
    std::vector<uint32_t> out;
    scan(x, 0, n, t, out);
    return out;
  }
  std::vector<std::vector<uint32_t>> pieces(parts);
  ctx.pool->parallel_for(parts, 1, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) scan(x, n * p / parts, n * (p + 1) / parts, t, pieces[p]);
  });
  std::vector<uint32_t> out;
  size_t total = 0;
  for (const auto& p : pieces) total += p.size();
  out.reserve(total);
  for (const auto& p : pieces) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// Keeps exactly k of the ascending candidates: all above the k-th magnitude,
// then the lowest-index ties.
std::vector<uint32_t> trim(const float* x, const std::vector<uint32_t>& cand, int64_t k) {
  const float tk = kth_magnitude(x, cand.data(), static_cast<int64_t>(cand.size()), k);
  int64_t above = 0;
  for (uint32_t i : cand) above += std::fabs(x[i]) > tk;
  int64_t ties_left = k - above;
  std::vector<uint32_t> out;
  out.reserve(static_cast<size_t>(k));
  for (uint32_t i : cand) {
    const float a = std::fabs(x[i]);
    if (a > tk || (a == tk && ties_left-- > 0)) out.push_back(i);
  }
  return out;
}

}  // namespace

float kth_magnitude(const float* x, const uint32_t* idx, int64_t count, int64_t k) {
  std::vector<float> mags(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) mags[i] = std::fabs(x[idx ? idx[i] : i]);
  std::nth_element(mags.begin(), mags.begin() + (k - 1), mags.end(), std::greater<float>());
  return mags[k - 1];
}

std::vector<uint32_t> topk_indices(const float* x, int64_t n, int64_t k, bool approximate,
                                   const ExecContext& ctx) {
  if (k <= 0) return {};
  if (k >= n) {
    std::vector<uint32_t> all(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) all[i] = static_cast<uint32_t>(i);
    return all;
  }
  if (approximate && n >= (1 << 16)) {
    // Threshold from a strided sample, aimed at ~1.5 k candidates.
    const int64_t m = std::min<int64_t>(n, 1 << 16);
    std::vector<float> sample(static_cast<size_t>(m));
    for (int64_t j = 0; j < m; ++j) sample[j] = std::fabs(x[j * n / m]);
    int64_t rank = std::min<int64_t>(m, (k * m * 3) / (2 * n) + 16);
    for (int attempt = 0; attempt < 4; ++attempt) {
      std::nth_element(sample.begin(), sample.begin() + (rank - 1), sample.end(), std::greater<float>());
      const std::vector<uint32_t> cand = candidates(x, n, sample[rank - 1], ctx);
      if (static_cast<int64_t>(cand.size()) >= k) return trim(x, cand, k);
      if (rank == m) break;
      rank = std::min(m, rank * 4);  // too few above the threshold: lower it
    }
  }
  const float tk = kth_magnitude(x, nullptr, n, k);
  return trim(x, candidates(x, n, tk, ctx), k);
}

}  // namespace relaxcc::kernels::cpu
