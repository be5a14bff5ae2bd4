#include "kernels/cpu/topk.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>

#include "kernels/cpu/cpu_kernels.h"
#include "relaxcc/errors.h"
#include "relaxcc/thread_pool.h"

namespace relaxcc::kernels::cpu {

namespace {

// Elements x[offset + j * stride], j in [0, count).
struct View {
  const float* x;
  int64_t offset, stride, count;

  int64_t index(int64_t j) const { return offset + j * stride; }
  float operator[](int64_t j) const { return x[index(j)]; }
  // AVX2 gathers take 32-bit signed offsets: seven strides must fit.
  bool gatherable() const { return stride <= (int64_t{1} << 31) / 8; }
};

uint32_t magnitude_bits(float v) {
  return std::bit_cast<uint32_t>(v) & 0x7fffffffu;  // ordered like |v| for finite v
}

// Candidates (index into x, value) in ascending index order. The buffers have
// room for 32 more than `size` whenever a scan writes, so the vector path
// stores whole registers.
struct Candidates {
  std::unique_ptr<uint32_t[]> idx;
  std::unique_ptr<float[]> val;
  int64_t size = 0, capacity = 0;
  bool bad = false;  // a NaN or infinity was scanned

  void reserve(int64_t want) {
    if (want <= capacity) return;
    const int64_t cap = std::max(want, capacity * 2);
    auto i = std::make_unique_for_overwrite<uint32_t[]>(static_cast<size_t>(cap));
    auto v = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(cap));
    if (size > 0) {
      std::memcpy(i.get(), idx.get(), static_cast<size_t>(size) * 4);
      std::memcpy(v.get(), val.get(), static_cast<size_t>(size) * 4);
    }
    idx = std::move(i);
    val = std::move(v);
    capacity = cap;
  }
  void push(uint32_t i, float v) {
    reserve(size + 33);
    idx[size] = i;
    val[size] = v;
    ++size;
  }
};

void scan_scalar(const View& x, int64_t begin, int64_t end, float t, Candidates& out) {
  for (int64_t j = begin; j < end; ++j) {
    const float v = x[j];
    if (!std::isfinite(v)) {
      out.bad = true;
    } else if (std::fabs(v) >= t) {
      out.push(static_cast<uint32_t>(x.index(j)), v);
    }
  }
}

// For each 8-bit mask, the lanes whose bit is set, first (a
// _mm256_permutevar8x32 pattern that packs them to the front).
constexpr std::array<std::array<int32_t, 8>, 256> kCompress = [] {
  std::array<std::array<int32_t, 8>, 256> lut{};
  for (int m = 0; m < 256; ++m) {
    int n = 0;
    for (int l = 0; l < 8; ++l)
      if (m & (1 << l)) lut[m][n++] = l;
  }
  return lut;
}();

// Stores the lanes of `idx` and `val` whose bit is set in `mask` (8 bits),
// packed, at idx_out and val_out (room for 8 each); returns how many.
__attribute__((target("avx2"), always_inline)) inline int compress_store(uint32_t mask, __m256i idx,
                                                                         __m256 val,
                                                                         uint32_t* idx_out,
                                                                         float* val_out) {
  const __m256i perm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kCompress[mask].data()));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx_out), _mm256_permutevar8x32_epi32(idx, perm));
  _mm256_storeu_ps(val_out, _mm256_permutevar8x32_ps(val, perm));
  return std::popcount(mask);
}

// Compares 32 magnitudes per iteration (at low density most masks are
// empty); each non-empty group of 8 writes its candidates' indices and values
// with one permute each. Works in blocks whose candidates fit the buffers.
template <bool kStrided>
__attribute__((target("avx2"))) void scan_avx2(const View& x, int64_t begin, int64_t end, float t,
                                               Candidates& out) {
  constexpr int64_t kAhead = 256, kBlock = 4096;
  const __m256 vt = _mm256_set1_ps(t);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i lane_step =
      _mm256_mullo_epi32(lanes, _mm256_set1_epi32(static_cast<int>(x.stride)));
  const int64_t step = std::max<int64_t>(16, x.stride);  // prefetch stride, in floats
  // The largest magnitude's bits, signed: NaN and infinity are >= 0x7f800000.
  __m256i top = _mm256_setzero_si256();
  int64_t j = begin;
  while (j + 32 <= end) {
    out.reserve(out.size + kBlock + 33);
    uint32_t* idx_out = out.idx.get();
    float* val_out = out.val.get();
    int64_t size = out.size;
    for (const int64_t stop = std::min(end, j + kBlock); j + 32 <= stop; j += 32) {
      if (kStrided && j + kAhead + 32 <= end) {
        // Gathers alone do not keep the memory streaming: prefetch every line
        // (every element, for strides of a line or more) kAhead elements on.
        const float* p = x.x + x.index(j + kAhead);
        for (int64_t o = 0; o < 32 * x.stride; o += step)
          _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
      }
      __m256 v[4];
      uint32_t mask[4], any = 0;
      for (int k = 0; k < 4; ++k) {
        const float* p = x.x + x.index(j + 8 * k);
        v[k] = kStrided ? _mm256_i32gather_ps(p, lane_step, 4) : _mm256_loadu_ps(p);
        const __m256i a = _mm256_and_si256(_mm256_castps_si256(v[k]), abs_mask);
        top = _mm256_max_epi32(top, a);
        mask[k] = static_cast<uint32_t>(
            _mm256_movemask_ps(_mm256_cmp_ps(_mm256_castsi256_ps(a), vt, _CMP_GE_OQ)));
        any |= mask[k];
      }
      if (any == 0) continue;
      for (int k = 0; k < 4; ++k) {
        if (mask[k] == 0) continue;
        const __m256i idx = _mm256_add_epi32(
            _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(x.index(j + 8 * k)))),
            lane_step);
        size += compress_store(mask[k], idx, v[k], idx_out + size, val_out + size);
      }
    }
    out.size = size;
  }
  if (_mm256_movemask_ps(
          _mm256_castsi256_ps(_mm256_cmpgt_epi32(top, _mm256_set1_epi32(0x7f7fffff)))) != 0)
    out.bad = true;
  scan_scalar(x, j, end, t, out);
}

void scan(const View& x, int64_t begin, int64_t end, float t, Candidates& out) {
  if (has_avx2() && x.stride == 1)
    scan_avx2<false>(x, begin, end, t, out);
  else if (has_avx2() && x.gatherable())
    scan_avx2<true>(x, begin, end, t, out);
  else
    scan_scalar(x, begin, end, t, out);
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

[[noreturn]] void throw_non_finite(const View& x, const char* what) {
  int64_t j = 0;
  if (x.stride == 1) {
    j = first_bad(x.x + x.offset, 0, x.count);
  } else {
    while (std::isfinite(x[j])) ++j;
  }
  RELAXCC_THROW(InvalidArgument, what, ": element ", x.index(j), " is ", x[j],
                "; compressors take finite values (check for overflow first)");
}

// Candidates with |x| >= t, in index order, into `out` (emptied first), the
// scan split over the pool.
void candidates(const View& x, float t, const ExecContext& ctx, int64_t expected, const char* what,
                Candidates& out) {
  const int parts = ctx.pool ? ctx.pool->num_threads() : 1;
  out.size = 0;
  out.bad = false;
  if (parts == 1 || x.count < (1 << 20)) {
    out.reserve(expected + 33);
    scan(x, 0, x.count, t, out);
  } else {
    std::vector<Candidates> pieces(parts);
    ctx.pool->parallel_for(parts, 1, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) {
        pieces[p].reserve(expected / parts + 1024);
        scan(x, x.count * p / parts, x.count * (p + 1) / parts, t, pieces[p]);
      }
    });
    int64_t total = 0;
    for (const auto& p : pieces) total += p.size;
    out.reserve(total + 33);
    for (const auto& p : pieces) {
      if (p.size > 0) {
        std::memcpy(out.idx.get() + out.size, p.idx.get(), static_cast<size_t>(p.size) * 4);
        std::memcpy(out.val.get() + out.size, p.val.get(), static_cast<size_t>(p.size) * 4);
      }
      out.size += p.size;
      out.bad |= p.bad;
    }
  }
  if (out.bad) throw_non_finite(x, what);
}

// Writes, in order, the candidates [i, n) whose magnitude bits are above
// kth, and of those equal to it the first *ties_left (counted down), until k
// are written (pos counts them); returns the candidate reached.
int64_t keep_scalar(const Candidates& cand, int64_t i, int64_t n, uint32_t kth, int64_t k,
                    int64_t& ties_left, int64_t& pos, uint32_t* indices, float* values) {
  for (; i < n && pos < k; ++i) {
    const uint32_t b = magnitude_bits(cand.val[i]);
    const bool tie = b == kth;
    if (b > kth || (tie && ties_left > 0)) {
      ties_left -= tie;
      indices[pos] = cand.idx[i];
      values[pos] = cand.val[i];
      ++pos;
    }
  }
  return i;
}

// The same, 8 candidates at a time while 8 more fit before k; a group with a
// tie goes to the scalar loop.
__attribute__((target("avx2"))) int64_t keep_avx2(const Candidates& cand, int64_t n, uint32_t kth,
                                                  int64_t k, int64_t& ties_left, int64_t& pos,
                                                  uint32_t* indices, float* values) {
  const uint32_t* idx = cand.idx.get();
  const float* val = cand.val.get();
  const __m256i vkth = _mm256_set1_epi32(static_cast<int>(kth));
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  int64_t i = 0, p = pos;
  for (; i + 8 <= n && p + 8 <= k; i += 8) {
    const __m256 v = _mm256_loadu_ps(val + i);
    const __m256i b = _mm256_and_si256(_mm256_castps_si256(v), abs_mask);
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(b, vkth)) != 0) {
      pos = p;
      keep_scalar(cand, i, i + 8, kth, k, ties_left, pos, indices, values);
      p = pos;
      continue;
    }
    const auto gt =
        static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(b, vkth))));
    if (gt == 0) continue;
    const __m256i iv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx + i));
    if (gt == 0xff) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(indices + p), iv);
      _mm256_storeu_ps(values + p, v);
      p += 8;
    } else {
      alignas(32) uint32_t ti[8];
      alignas(32) float tv[8];
      const int c = compress_store(gt, iv, v, ti, tv);
      std::memcpy(indices + p, ti, static_cast<size_t>(c) * 4);
      std::memcpy(values + p, tv, static_cast<size_t>(c) * 4);
      p += c;
    }
  }
  pos = p;
  return i;
}

// Keeps exactly k (<= cand.size) of the candidates, all >= t in magnitude:
// every one above the k-th largest magnitude, then the lowest-index ties.
// The k-th largest comes from a histogram of magnitude bits just above t
// (fine bins where the candidates to drop lie), then a selection within its
// bin.
void keep_k(const Candidates& cand, int64_t k, float t, uint32_t* indices, float* values) {
  const int64_t n = cand.size, drop = n - k;
  const float* val = cand.val.get();
  const uint32_t tb = magnitude_bits(t);
  constexpr int kShift = 8, kBins = 4096;
  auto bin_of = [tb](uint32_t b) {
    return static_cast<int>(std::min<uint32_t>((b - tb) >> kShift, kBins - 1));
  };
  uint32_t kth = tb;  // the k-th largest magnitude's bits (any candidate's, when all are kept)
  int64_t above = 0;  // candidates above it (ties with it fill up to k)
  if (drop > 0) {
    std::vector<uint32_t> hist(kBins, 0);
    for (int64_t i = 0; i < n; ++i) ++hist[bin_of(magnitude_bits(val[i]))];
    int bin = 0;
    int64_t below = 0;  // candidates in the bins before `bin`
    while (below + hist[bin] <= drop) below += hist[bin++];
    std::vector<uint32_t> in_bin;
    in_bin.reserve(hist[bin]);
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t b = magnitude_bits(val[i]);
      if (bin_of(b) == bin) in_bin.push_back(b);
    }
    // Ascending, the k-th largest overall is the (drop + 1)-th smallest.
    const auto nth = in_bin.begin() + (drop - below);
    std::nth_element(in_bin.begin(), nth, in_bin.end());
    kth = *nth;
    for (uint32_t b : in_bin) above += b > kth;
    for (int b = bin + 1; b < kBins; ++b) above += hist[b];
  }
  int64_t ties_left = k - above, pos = 0;
  const int64_t i = has_avx2() ? keep_avx2(cand, n, kth, k, ties_left, pos, indices, values) : 0;
  keep_scalar(cand, i, n, kth, k, ties_left, pos, indices, values);
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

void topk_strided(const float* data, int64_t offset, int64_t stride, int64_t count, int64_t k,
                  bool approximate, const ExecContext& ctx, const char* what, uint32_t* indices,
                  float* values) {
  const View x{data, offset, stride, count};
  if (k <= 0) return;
  // Reused across calls (no page faults for a fresh buffer each time), unless
  // a call left it large.
  thread_local Candidates cand;
  struct Release {
    ~Release() {
      if (cand.capacity > (int64_t{1} << 24)) cand = Candidates{};
    }
  } release;
  if (k >= count) {
    candidates(x, 0.0f, ctx, count, what, cand);
    return keep_k(cand, count, 0.0f, indices, values);
  }
  if (approximate && count >= (1 << 16)) {
    // Threshold from a sample of 256 evenly spaced runs of 256 elements
    // (sequential reads), aimed at 5% more candidates than k plus four
    // standard deviations of the sample's count. A threshold that turns out
    // too high is lowered and the scan repeated, so the count is always
    // exact and recall only depends on ties.
    constexpr int64_t kRuns = 256, kRun = 256;
    constexpr int64_t m = kRuns * kRun;
    std::vector<float> sample(static_cast<size_t>(m));
    for (int64_t r = 0; r < kRuns; ++r) {
      const int64_t start = r * (count - kRun) / (kRuns - 1);
      for (int64_t j = 0; j < kRun; ++j) sample[r * kRun + j] = std::fabs(x[start + j]);
    }
    const double expect = static_cast<double>(k) * m / static_cast<double>(count);
    int64_t rank =
        std::min<int64_t>(m, static_cast<int64_t>(expect * 1.05 + 4 * std::sqrt(expect)) + 16);
    for (int attempt = 0; attempt < 4; ++attempt) {
      std::nth_element(sample.begin(), sample.begin() + (rank - 1), sample.end(),
                       std::greater<float>());
      const float t = sample[rank - 1];
      candidates(x, t, ctx, rank * count / m + 1024, what, cand);
      if (cand.size >= k) return keep_k(cand, k, t, indices, values);
      if (rank == m) break;
      rank = std::min(m, rank * 4);  // too few above the threshold: lower it
    }
  }
  std::vector<float> mags(static_cast<size_t>(count));
  for (int64_t j = 0; j < count; ++j) {
    mags[j] = std::fabs(x[j]);
    if (!std::isfinite(mags[j])) throw_non_finite(x, what);
  }
  std::nth_element(mags.begin(), mags.begin() + (k - 1), mags.end(), std::greater<float>());
  const float t = mags[k - 1];
  candidates(x, t, ctx, k + 1024, what, cand);
  keep_k(cand, k, t, indices, values);
}

Selection topk(const float* x, int64_t n, int64_t k, bool approximate, const ExecContext& ctx,
               const char* what) {
  const int64_t kept = std::clamp<int64_t>(k, 0, n);
  Selection out;
  out.indices.resize(static_cast<size_t>(kept));
  out.values.resize(static_cast<size_t>(kept));
  topk_strided(x, 0, 1, n, kept, approximate, ctx, what, out.indices.data(), out.values.data());
  return out;
}

}  // namespace relaxcc::kernels::cpu
