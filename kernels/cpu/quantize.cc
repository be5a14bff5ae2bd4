#include "quantize.h"

#include <immintrin.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_kernels.h"
#include "relaxcc/kernels/philox.h"

namespace relaxcc::kernels::cpu {

namespace {

ChunkRange chunk_range_scalar(const float* x, int64_t len, int64_t start, float lo, float hi) {
  ChunkRange r{lo, hi, -1};
  for (int64_t i = start; i < len; ++i) {
    if (!std::isfinite(x[i])) {
      r.first_non_finite = i;
      return r;
    }
    r.min = std::min(r.min, x[i]);
    r.max = std::max(r.max, x[i]);
  }
  return r;
}

__attribute__((target("avx2"))) ChunkRange chunk_range_avx2(const float* x, int64_t len) {
  // Four accumulators each, so min/max latency does not serialize the loop.
  __m256 lo[4], hi[4], bad = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) lo[k] = hi[k] = _mm256_set1_ps(x[0]);
  int64_t i = 0;
  for (; i + 32 <= len; i += 32) {
    for (int k = 0; k < 4; ++k) {
      const __m256 v = _mm256_loadu_ps(x + i + 8 * k);
      lo[k] = _mm256_min_ps(lo[k], v);
      hi[k] = _mm256_max_ps(hi[k], v);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));  // NaN
    }
  }
  for (; i + 8 <= len; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    lo[0] = _mm256_min_ps(lo[0], v);
    hi[0] = _mm256_max_ps(hi[0], v);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  if (_mm256_movemask_ps(bad) != 0) return chunk_range_scalar(x, len, 0, x[0], x[0]);
  const __m256 l = _mm256_min_ps(_mm256_min_ps(lo[0], lo[1]), _mm256_min_ps(lo[2], lo[3]));
  const __m256 h = _mm256_max_ps(_mm256_max_ps(hi[0], hi[1]), _mm256_max_ps(hi[2], hi[3]));
  alignas(32) float ls[8], hs[8];
  _mm256_store_ps(ls, l);
  _mm256_store_ps(hs, h);
  float mn = ls[0], mx = hs[0];
  for (int k = 1; k < 8; ++k) {
    mn = std::min(mn, ls[k]);
    mx = std::max(mx, hs[k]);
  }
  ChunkRange r = chunk_range_scalar(x, len, i, mn, mx);
  // An infinity shows up in the range itself.
  if (r.first_non_finite < 0 && !(std::isfinite(r.min) && std::isfinite(r.max)))
    return chunk_range_scalar(x, len, 0, x[0], x[0]);
  return r;
}

// Round-to-nearest codes, one byte each, clamped to [0, levels]: 32
// elements per iteration.
__attribute__((target("avx2"))) int64_t quantize8_avx2(const float* x, int64_t len, float min, float scale,
                                                       uint32_t levels, unsigned char* out) {
  const __m256 vmin = _mm256_set1_ps(min), vs = _mm256_set1_ps(scale);
  const __m256i lo = _mm256_setzero_si256(), hi = _mm256_set1_epi32(static_cast<int>(levels));
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t i = 0;
  for (; i + 32 <= len; i += 32) {
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8 * k), vmin), vs);
      q[k] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(v), lo), hi);  // rint: MXCSR nearest-even
    }
    const __m256i a = _mm256_packus_epi32(q[0], q[1]);  // 16-bit, lanes interleaved
    const __m256i b = _mm256_packus_epi32(q[2], q[3]);
    const __m256i c = _mm256_packus_epi16(a, b);       // 8-bit, in 32-bit groups per lane
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_permutevar8x32_epi32(c, perm));
  }
  return i;
}

__attribute__((target("avx2"))) int64_t dequantize8_avx2(const unsigned char* codes, int64_t len, float min,
                                                         float inv, float* out, bool accumulate) {
  const __m256 vmin = _mm256_set1_ps(min), vinv = _mm256_set1_ps(inv);
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i));
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
    __m256 v = _mm256_add_ps(vmin, _mm256_mul_ps(q, vinv));
    if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(out + i), v);
    _mm256_storeu_ps(out + i, v);
  }
  return i;
}

inline uint32_t code_of(float x, float min, float scale, uint32_t levels) {
  const float v = std::nearbyint((x - min) * scale);
  return v <= 0.0f ? 0u : v >= static_cast<float>(levels) ? levels : static_cast<uint32_t>(v);
}

}  // namespace

ChunkRange chunk_range(const float* x, int64_t len) {
  if (len == 0) return {};
  if (has_avx2() && len >= 8) return chunk_range_avx2(x, len);
  return chunk_range_scalar(x, len, 0, x[0], x[0]);
}

float minmax_scale(float min, float max, int bits) {
  if (!(max > min)) return 0.0f;
  const float levels = static_cast<float>((1u << bits) - 1u);
  const float s = levels / (max - min);
  return std::isfinite(s) ? s : FLT_MAX;
}

namespace {

// One byte per code; packed afterwards for fewer bits.
void codes_bytewise(const float* x, int64_t len, float min, float scale, int bits, Rounding rounding,
                    uint64_t seed, uint64_t offset, int64_t index0, unsigned char* out) {
  const uint32_t levels = (1u << bits) - 1u;
  if (rounding == Rounding::nearest) {
    const int64_t done = has_avx2() ? quantize8_avx2(x, len, min, scale, levels, out) : 0;
    for (int64_t i = done; i < len; ++i) out[i] = static_cast<unsigned char>(code_of(x[i], min, scale, levels));
    return;
  }
  // Stochastic: one Philox block gives the uniforms of 4 consecutive indices.
  for (int64_t i = 0; i < len;) {
    const uint64_t index = static_cast<uint64_t>(index0 + i);
    const Philox4x32 r = philox4x32(seed, 0, offset + (index >> 2));
    for (uint64_t lane = index & 3; lane < 4 && i < len; ++lane, ++i) {
      const float u = static_cast<float>(r.v[lane] >> 8) * (1.0f / 16777216.0f);
      const float v = std::floor((x[i] - min) * scale + u);
      out[i] = static_cast<unsigned char>(v <= 0.0f ? 0u : v >= static_cast<float>(levels) ? levels : static_cast<uint32_t>(v));
    }
  }
}

// Codes of BITS bits, little-endian within each byte, to one byte each.
template <int BITS>
void unpack(const unsigned char* codes, int64_t len, unsigned char* out) {
  constexpr int kPer = 8 / BITS;
  constexpr unsigned kMask = (1u << BITS) - 1u;
  const int64_t whole = len / kPer;
  for (int64_t b = 0; b < whole; ++b)
    for (int j = 0; j < kPer; ++j) out[b * kPer + j] = static_cast<unsigned char>((codes[b] >> (j * BITS)) & kMask);
  for (int64_t i = whole * kPer; i < len; ++i)
    out[i] = static_cast<unsigned char>((codes[i / kPer] >> ((i % kPer) * BITS)) & kMask);
}

std::vector<unsigned char>& scratch_codes(int64_t len) {
  thread_local std::vector<unsigned char> codes;
  if (codes.size() < static_cast<size_t>(len)) codes.resize(static_cast<size_t>(len));
  return codes;
}

}  // namespace

void quantize_chunk(const float* x, int64_t len, float min, float scale, int bits, Rounding rounding,
                    uint64_t seed, uint64_t offset, int64_t index0, unsigned char* codes) {
  if (bits == 8) return codes_bytewise(x, len, min, scale, 8, rounding, seed, offset, index0, codes);
  unsigned char* q = scratch_codes(len).data();
  codes_bytewise(x, len, min, scale, bits, rounding, seed, offset, index0, q);
  const int per_byte = 8 / bits;
  const int64_t bytes = (len * bits + 7) / 8;
  for (int64_t b = 0; b < bytes; ++b) {
    unsigned packed = 0;
    for (int j = 0; j < per_byte; ++j) {
      const int64_t i = b * per_byte + j;
      if (i < len) packed |= static_cast<unsigned>(q[i]) << (j * bits);
    }
    codes[b] = static_cast<unsigned char>(packed);
  }
}

void dequantize_chunk(const unsigned char* codes, int64_t len, float min, float scale, int bits, float* out,
                      bool accumulate) {
  const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
  const unsigned char* q = codes;
  if (bits != 8) {  // unpack to one byte per code, then the 8-bit path
    unsigned char* unpacked = scratch_codes(len).data();
    switch (bits) {
      case 4: unpack<4>(codes, len, unpacked); break;
      case 2: unpack<2>(codes, len, unpacked); break;
      default: unpack<1>(codes, len, unpacked); break;
    }
    q = unpacked;
  }
  const int64_t done = has_avx2() ? dequantize8_avx2(q, len, min, inv, out, accumulate) : 0;
  for (int64_t i = done; i < len; ++i) {
    const float v = min + static_cast<float>(q[i]) * inv;
    out[i] = accumulate ? out[i] + v : v;
  }
}

}  // namespace relaxcc::kernels::cpu
