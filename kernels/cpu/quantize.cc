#include "kernels/cpu/quantize.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
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

// The 32 codes of q[0..3] (8 each, in order) as bytes in order, each
// saturated to [0, 255].
__attribute__((target("avx2"), always_inline)) inline __m256i pack_codes_avx2(const __m256i* q) {
  const __m256i a = _mm256_packus_epi32(q[0], q[1]);  // 16-bit, lanes interleaved
  const __m256i b = _mm256_packus_epi32(q[2], q[3]);
  const __m256i c = _mm256_packus_epi16(a, b);  // 8-bit, in 32-bit groups per lane
  return _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Round-to-nearest codes of ((x - min) * prescale) * scale, one byte each,
// clamped to [0, levels]: 32 elements per iteration.
__attribute__((target("avx2"))) int64_t quantize8_avx2(const float* x, int64_t len, float min,
                                                       float prescale, float scale, uint32_t levels,
                                                       unsigned char* out) {
  const __m256 vmin = _mm256_set1_ps(min), vp = _mm256_set1_ps(prescale),
               vs = _mm256_set1_ps(scale);
  const __m256i lo = _mm256_setzero_si256(), hi = _mm256_set1_epi32(static_cast<int>(levels));
  int64_t i = 0;
  for (; i + 32 <= len; i += 32) {
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 v =
          _mm256_mul_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8 * k), vmin), vp), vs);
      q[k] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(v), lo),
                              hi);  // rint: MXCSR nearest-even
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), pack_codes_avx2(q));
  }
  return i;
}

// min + (q * inv) * down for 8 codes at a time.
__attribute__((target("avx2"))) int64_t dequantize8_avx2(const unsigned char* codes, int64_t len,
                                                         float min, float inv, float down,
                                                         float* out, bool accumulate) {
  const __m256 vmin = _mm256_set1_ps(min), vinv = _mm256_set1_ps(inv), vdown = _mm256_set1_ps(down);
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i));
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
    __m256 v = _mm256_add_ps(vmin, _mm256_mul_ps(_mm256_mul_ps(q, vinv), vdown));
    if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(out + i), v);
    _mm256_storeu_ps(out + i, v);
  }
  return i;
}

// Stochastic rounding with the uniforms of rounding_uniform(), 64 * G
// elements at a time: Philox4x32-10 on four counters per vector, one per
// 64-bit lane as _mm256_mul_epu32 wants (the upper halves of the lanes hold
// junk that no multiply reads and the final blend drops), G vectors side by
// side so that their multiply latencies overlap. Each block's 128 bits,
// words v[0..3] little-endian, are the 8-bit cells of its sixteen elements
// in element order.
struct Stochastic {
  static constexpr int64_t per_vector = 4 * rounding_block_elements;  // elements
  __m256 vmin, vp, vs, base;
  __m256i vlevels, cell_bytes, cells_base, m0, m1, lane;
  __m256i key0[10], key1[10];
  uint64_t offset;

  __attribute__((target("avx2"))) Stochastic(float min, float prescale, float scale,
                                             uint32_t levels, uint64_t seed, uint64_t offset_)
      : vmin(_mm256_set1_ps(min)),
        vp(_mm256_set1_ps(prescale)),
        vs(_mm256_set1_ps(scale)),
        base(_mm256_set1_ps(128.0f)),
        vlevels(_mm256_set1_epi8(static_cast<char>(levels))),
        cell_bytes(_mm256_setr_epi8(-1, 0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1,
                                    0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1)),
        cells_base(_mm256_set1_epi32(0x43000080)),
        m0(_mm256_set1_epi64x(0xD2511F53)),
        m1(_mm256_set1_epi64x(0xCD9E8D57)),
        lane(_mm256_setr_epi64x(0, 1, 2, 3)),
        offset(offset_) {
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      key0[round] = _mm256_set1_epi32(static_cast<int>(k0));
      key1[round] = _mm256_set1_epi32(static_cast<int>(k1));
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
  }

  // The Philox state of the blocks of elements [index, index + 64 * G),
  // `index` a multiple of rounding_block_elements, after the first round
  // (counter_hi is 0, so that round has one multiply): c[word][g].
  template <int G>
  __attribute__((target("avx2"), always_inline)) inline void counters(uint64_t index,
                                                                      __m256i (&c)[4][G]) const {
    for (int g = 0; g < G; ++g) {
      const uint64_t counter = rounding_counter(offset, index + per_vector * g);
      const __m256i ctr =
          _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(counter)), lane);
      const __m256i p0 = _mm256_mul_epu32(ctr, m0);
      c[0][g] = _mm256_xor_si256(_mm256_srli_epi64(ctr, 32), key0[0]);
      c[1][g] = _mm256_setzero_si256();
      c[2][g] = _mm256_xor_si256(_mm256_srli_epi64(p0, 32), key1[0]);
      c[3][g] = p0;
    }
  }

  // One round's multiplies; the caller XORs hi(p1) ^ c1 ^ key0 into c0 and
  // hi(p0) ^ c3 ^ key1 into c2 (the key off the multiply's critical path).
  template <int G>
  __attribute__((target("avx2"), always_inline)) inline void products(const __m256i (&c)[4][G],
                                                                      __m256i (&p0)[G],
                                                                      __m256i (&p1)[G]) const {
    for (int g = 0; g < G; ++g) {
      p0[g] = _mm256_mul_epu32(c[0][g], m0);
      p1[g] = _mm256_mul_epu32(c[2][g], m1);
    }
  }

  template <int G>
  __attribute__((target("avx2"), always_inline)) inline void rounds_avx2(__m256i (&c)[4][G]) const {
    for (int round = 1; round < 10; ++round) {
      __m256i p0[G], p1[G];
      products<G>(c, p0, p1);
      for (int g = 0; g < G; ++g) {
        c[0][g] =
            _mm256_xor_si256(_mm256_srli_epi64(p1[g], 32), _mm256_xor_si256(c[1][g], key0[round]));
        c[2][g] =
            _mm256_xor_si256(_mm256_srli_epi64(p0[g], 32), _mm256_xor_si256(c[3][g], key1[round]));
        c[1][g] = p1[g];
        c[3][g] = p0[g];
      }
    }
  }

  // The same rounds with three-way XORs (and 32 vector registers).
  template <int G>
  __attribute__((target("avx2,avx512f,avx512vl"), always_inline)) inline void rounds_avx512(
      __m256i (&c)[4][G]) const {
    for (int round = 1; round < 10; ++round) {
      __m256i p0[G], p1[G];
      products<G>(c, p0, p1);
      for (int g = 0; g < G; ++g) {
        c[0][g] =
            _mm256_ternarylogic_epi32(_mm256_srli_epi64(p1[g], 32), c[1][g], key0[round], 0x96);
        c[2][g] =
            _mm256_ternarylogic_epi32(_mm256_srli_epi64(p0[g], 32), c[3][g], key1[round], 0x96);
        c[1][g] = p1[g];
        c[3][g] = p0[g];
      }
    }
  }

  // Codes of x[0, 64 * G) to out[0, 64 * G) from the blocks' final state.
  template <int G>
  __attribute__((target("avx2"), always_inline)) inline void codes(const __m256i (&c)[4][G],
                                                                   const float* x,
                                                                   unsigned char* out) const {
    for (int g = 0; g < G; ++g) {
      // Words 0 and 1 of block j in dwords 2j and 2j + 1 of c01 (its bytes
      // 0..7, the cells of elements 0..7), words 2 and 3 in c23.
      const __m256i c01 = _mm256_blend_epi32(c[0][g], _mm256_slli_epi64(c[1][g], 32), 0xAA);
      const __m256i c23 = _mm256_blend_epi32(c[2][g], _mm256_slli_epi64(c[3][g], 32), 0xAA);
      __m256i q[8];
      for (int k = 0; k < 8; ++k) {
        // Elements 8k..8k+7, whose cells are words 0 and 1 (2 and 3 for odd
        // k) of block j: the low lane gets the first word, the high lane the
        // second; dword e of a lane takes byte e of the lane's word as bits
        // 15..8 of 128.0f, with bit 7 set: 128 + (2h + 1) / 2^9, exact, and
        // u is that minus 128, exact.
        const int j = k / 2;
        const __m256i words = _mm256_permutevar8x32_epi32(
            k % 2 == 0 ? c01 : c23, _mm256_setr_epi32(2 * j, 2 * j, 2 * j, 2 * j, 2 * j + 1,
                                                      2 * j + 1, 2 * j + 1, 2 * j + 1));
        const __m256i h = _mm256_shuffle_epi8(words, cell_bytes);
        const __m256 u = _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(h, cells_base)), base);
        const __m256 t = _mm256_add_ps(
            _mm256_mul_ps(
                _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + per_vector * g + 8 * k), vmin), vp),
                vs),
            u);
        // x >= min, so t >= u > 0 and truncation is the floor; t is about
        // levels at most, far below 2^31, so the saturating packs and the
        // min clamp from above.
        q[k] = _mm256_cvttps_epi32(t);
      }
      for (int half = 0; half < 2; ++half)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + per_vector * g + 32 * half),
                            _mm256_min_epu8(pack_codes_avx2(q + 4 * half), vlevels));
    }
  }
};

// Stochastic codes of x[0, Stochastic::per_vector * m), whose first index
// index0 is a multiple of rounding_block_elements; return the elements done.
__attribute__((target("avx2"))) int64_t stochastic_avx2(const float* x, int64_t len,
                                                        const Stochastic& shared, int64_t index0,
                                                        unsigned char* out) {
  const Stochastic sr = shared;  // a local copy: stores through `out` cannot alias it
  int64_t i = 0;
  for (; i + 4 * Stochastic::per_vector <= len; i += 4 * Stochastic::per_vector) {
    __m256i c[4][4];
    sr.counters<4>(static_cast<uint64_t>(index0 + i), c);
    sr.rounds_avx2<4>(c);
    sr.codes<4>(c, x + i, out + i);
  }
  for (; i + Stochastic::per_vector <= len; i += Stochastic::per_vector) {
    __m256i c[4][1];
    sr.counters<1>(static_cast<uint64_t>(index0 + i), c);
    sr.rounds_avx2<1>(c);
    sr.codes<1>(c, x + i, out + i);
  }
  return i;
}

__attribute__((target("avx2,avx512f,avx512vl"))) int64_t stochastic_avx512(
    const float* x, int64_t len, const Stochastic& shared, int64_t index0, unsigned char* out) {
  const Stochastic sr = shared;  // a local copy: stores through `out` cannot alias it
  int64_t i = 0;
  for (; i + 4 * Stochastic::per_vector <= len; i += 4 * Stochastic::per_vector) {
    __m256i c[4][4];
    sr.counters<4>(static_cast<uint64_t>(index0 + i), c);
    sr.rounds_avx512<4>(c);
    sr.codes<4>(c, x + i, out + i);
  }
  for (; i + Stochastic::per_vector <= len; i += Stochastic::per_vector) {
    __m256i c[4][1];
    sr.counters<1>(static_cast<uint64_t>(index0 + i), c);
    sr.rounds_avx512<1>(c);
    sr.codes<1>(c, x + i, out + i);
  }
  return i;
}

__attribute__((target("avx2"))) int64_t sign_pack_avx2(const float* x, int64_t len,
                                                       unsigned char* bits) {
  int64_t i = 0;
  for (; i + 8 <= len; i += 8)
    bits[i / 8] = static_cast<unsigned char>(_mm256_movemask_ps(_mm256_loadu_ps(x + i)));
  return i;
}

__attribute__((target("avx2"))) int64_t sign_unpack_avx2(const unsigned char* bits, int64_t len,
                                                         float scale, float* out, bool accumulate) {
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const __m256i set =
        _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(bits[i / 8]), lane_bit), lane_bit);
    __m256 v = _mm256_xor_ps(vscale, _mm256_castsi256_ps(_mm256_and_si256(set, sign)));
    if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(out + i), v);
    _mm256_storeu_ps(out + i, v);
  }
  return i;
}

inline uint32_t code_of(float x, float min, float prescale, float scale, uint32_t levels) {
  const float v = std::nearbyint(((x - min) * prescale) * scale);
  return v <= 0.0f ? 0u : v >= static_cast<float>(levels) ? levels : static_cast<uint32_t>(v);
}

}  // namespace

ChunkRange chunk_range(const float* x, int64_t len) {
  if (len == 0) return {};
  if (has_avx2() && len >= 8) return chunk_range_avx2(x, len);
  return chunk_range_scalar(x, len, 0, x[0], x[0]);
}

float minmax_decoded_max(float min, float scale, int bits) {
  const float s = std::fabs(scale);
  const float inv = s > 0.0f ? 1.0f / s : 0.0f;
  const float down = std::signbit(scale) ? 1.0f / kMinmaxPrescale : 1.0f;
  return min + (static_cast<float>((1u << bits) - 1u) * inv) * down;
}

float minmax_scale(float min, float max, int bits) {
  if (!(max > min)) return 0.0f;
  const float levels = static_cast<float>((1u << bits) - 1u);
  const float range = max - min;
  // range >= 2^-100 keeps s <= 255 * 2^100 and the step >= 2^-108; below
  // it, range * 2^100 is exact and in [2^-49, 1).
  const bool prescaled = range < 1.0f / kMinmaxPrescale;
  float s = prescaled ? levels / (range * kMinmaxPrescale) : levels / range;
  const auto field = [&] { return prescaled ? -s : s; };
  // A few steps at most (see quantize.h); an Inf decoded maximum, for max
  // near FLT_MAX, is above max too.
  while (!(minmax_decoded_max(min, field(), bits) <= max)) s = std::nextafter(s, INFINITY);
  return field();
}

namespace {

// The factors of a scale field (see kMinmaxPrescale): the scale, and the
// multipliers before quantizing and after dequantizing.
struct ScaleField {
  float scale, up, down;
};
ScaleField scale_field(float field) {
  if (std::signbit(field)) return {std::fabs(field), kMinmaxPrescale, 1.0f / kMinmaxPrescale};
  return {field, 1.0f, 1.0f};
}

}  // namespace

namespace {

// One byte per code; packed afterwards for fewer bits.
void codes_bytewise(const float* x, int64_t len, float min, float field, int bits,
                    Rounding rounding, uint64_t seed, uint64_t offset, int64_t index0,
                    unsigned char* out) {
  const uint32_t levels = (1u << bits) - 1u;
  const ScaleField f = scale_field(field);
  const float scale = f.scale, up = f.up;
  if (rounding == Rounding::nearest) {
    const int64_t done = has_avx2() ? quantize8_avx2(x, len, min, up, scale, levels, out) : 0;
    for (int64_t i = done; i < len; ++i)
      out[i] = static_cast<unsigned char>(code_of(x[i], min, up, scale, levels));
    return;
  }
  // Stochastic: one Philox block gives the uniforms of rounding_block_elements
  // consecutive indices (rounding_uniform). The scalar loop takes the
  // elements before the first multiple of rounding_block_elements and after
  // the last whole group of Stochastic::per_vector; AVX2 the groups between.
  constexpr auto per_block = static_cast<int64_t>(rounding_block_elements);
  const int64_t head = std::min<int64_t>(len, (per_block - index0 % per_block) % per_block);
  int64_t vector_end = head;
  if (has_avx2()) {
    const Stochastic sr(min, up, scale, levels, seed, offset);
    vector_end += (has_avx512vl() ? stochastic_avx512 : stochastic_avx2)(x + head, len - head, sr,
                                                                         index0 + head, out + head);
  }
  auto scalar = [&](int64_t begin, int64_t end) {
    Philox4x32 block{};
    for (int64_t i = begin; i < end; ++i) {
      const uint64_t index = static_cast<uint64_t>(index0 + i);
      if (i == begin || index % rounding_block_elements == 0)
        block = philox4x32(seed, 0, rounding_counter(offset, index));
      const float v = std::floor(((x[i] - min) * up) * scale + rounding_uniform_of(block, index));
      out[i] =
          static_cast<unsigned char>(v <= 0.0f                         ? 0u
                                     : v >= static_cast<float>(levels) ? levels
                                                                       : static_cast<uint32_t>(v));
    }
  };
  scalar(0, head);
  scalar(vector_end, len);
}

// Packs one-byte codes of BITS bits (each < 2^BITS) little-endian into
// bytes, 32 codes at a time; returns how many codes it packed (a multiple of
// 32; the caller packs the rest).
template <int BITS>
__attribute__((target("avx2"))) int64_t pack_avx2(const unsigned char* q, int64_t len,
                                                  unsigned char* out) {
  int64_t i = 0;
  for (; i + 32 <= len; i += 32) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i));
    if constexpr (BITS == 1) {
      // Bit 0 of each byte to its top bit: movemask gathers them in order.
      const uint32_t m = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_slli_epi16(v, 7)));
      std::memcpy(out + i / 8, &m, 4);
    } else {
      // Pairs of codes to 16 bits (q0 + q1 << BITS), then on to bytes.
      __m256i w =
          _mm256_maddubs_epi16(v, _mm256_set1_epi16(static_cast<short>(1 | (1 << (8 + BITS)))));
      if constexpr (BITS == 2)  // pairs of pairs: (p0 + p1 << 4), 32-bit lanes
        w = _mm256_madd_epi16(w, _mm256_set1_epi32(1 | (16 << 16)));
      if constexpr (BITS == 4) {
        // 16 x 16-bit values < 256, in two 128-bit lanes: to 16 bytes.
        const __m128i lo = _mm256_castsi256_si128(w), hi = _mm256_extracti128_si256(w, 1);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i / 2), _mm_packus_epi16(lo, hi));
      } else {
        // 8 x 32-bit values < 256: to 8 bytes.
        const __m128i lo = _mm256_castsi256_si128(w), hi = _mm256_extracti128_si256(w, 1);
        const __m128i b16 = _mm_packus_epi32(lo, hi);
        const __m128i b8 = _mm_packus_epi16(b16, b16);
        _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i / 4), b8);
      }
    }
  }
  return i;
}

// Codes of BITS bits, little-endian within each byte, to one byte each, 32
// at a time; returns how many it unpacked.
template <int BITS>
__attribute__((target("avx2"))) int64_t unpack_avx2(const unsigned char* codes, int64_t len,
                                                    unsigned char* out) {
  constexpr int kPer = 8 / BITS;
  const __m256i mask = _mm256_set1_epi8(static_cast<char>((1 << BITS) - 1));
  int64_t i = 0;
  for (; i + 32 <= len; i += 32) {
    // Byte j of the result takes source byte j / kPer, shifted right by
    // (j % kPer) * BITS: broadcast the source bytes, shuffle each to its
    // kPer slots, then shift per slot with a multiply-free variable shift
    // on 16-bit lanes.
    __m256i v;
    if constexpr (BITS == 1) {
      uint32_t m;
      std::memcpy(&m, codes + i / 8, 4);
      const __m256i rep =
          _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(m)),
                              _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2,
                                               2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
      const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
      v = _mm256_min_epu8(_mm256_and_si256(rep, bit), _mm256_set1_epi8(1));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), v);
      continue;
    } else {
      __m128i src;
      if constexpr (BITS == 4) {
        src = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i / 2));
      } else {
        src = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i / 4));
      }
      // Each source byte repeated kPer times.
      const __m256i wide = _mm256_broadcastsi128_si256(src);
      const __m256i idx =
          BITS == 4 ? _mm256_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9,
                                       10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)
                    : _mm256_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4,
                                       5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
      const __m256i rep = _mm256_shuffle_epi8(wide, idx);
      // Shift slot s right by s * BITS: one shifted copy per slot, blended.
      v = _mm256_setzero_si256();
      for (int sl = 0; sl < kPer; ++sl) {
        alignas(32) unsigned char sel[32];
        for (int j = 0; j < 32; ++j) sel[j] = (j % kPer) == sl ? 0xff : 0;
        const __m256i shifted = _mm256_srli_epi16(rep, sl * BITS);
        v = _mm256_or_si256(
            v, _mm256_and_si256(shifted, _mm256_load_si256(reinterpret_cast<const __m256i*>(sel))));
      }
      v = _mm256_and_si256(v, mask);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), v);
  }
  return i;
}

// Codes of BITS bits, little-endian within each byte, to one byte each.
template <int BITS>
void unpack(const unsigned char* codes, int64_t len, unsigned char* out) {
  constexpr int kPer = 8 / BITS;
  constexpr unsigned kMask = (1u << BITS) - 1u;
  const int64_t done = has_avx2() ? unpack_avx2<BITS>(codes, len, out) : 0;
  const int64_t whole = len / kPer;
  for (int64_t b = done / kPer; b < whole; ++b)
    for (int j = 0; j < kPer; ++j)
      out[b * kPer + j] = static_cast<unsigned char>((codes[b] >> (j * BITS)) & kMask);
  for (int64_t i = whole * kPer; i < len; ++i)
    out[i] = static_cast<unsigned char>((codes[i / kPer] >> ((i % kPer) * BITS)) & kMask);
}

std::vector<unsigned char>& scratch_codes(int64_t len) {
  thread_local std::vector<unsigned char> codes;
  if (codes.size() < static_cast<size_t>(len)) codes.resize(static_cast<size_t>(len));
  return codes;
}

}  // namespace

void quantize_chunk(const float* x, int64_t len, float min, float scale, int bits,
                    Rounding rounding, uint64_t seed, uint64_t offset, int64_t index0,
                    unsigned char* codes) {
  if (bits == 8)
    return codes_bytewise(x, len, min, scale, 8, rounding, seed, offset, index0, codes);
  unsigned char* q = scratch_codes(len).data();
  codes_bytewise(x, len, min, scale, bits, rounding, seed, offset, index0, q);
  const int per_byte = 8 / bits;
  const int64_t bytes = (len * bits + 7) / 8;
  int64_t packed_codes = 0;
  if (has_avx2())
    packed_codes = bits == 4   ? pack_avx2<4>(q, len, codes)
                   : bits == 2 ? pack_avx2<2>(q, len, codes)
                               : pack_avx2<1>(q, len, codes);
  for (int64_t b = packed_codes / per_byte; b < bytes; ++b) {
    unsigned packed = 0;
    for (int j = 0; j < per_byte; ++j) {
      const int64_t i = b * per_byte + j;
      if (i < len) packed |= static_cast<unsigned>(q[i]) << (j * bits);
    }
    codes[b] = static_cast<unsigned char>(packed);
  }
}

void dequantize_chunk(const unsigned char* codes, int64_t len, float min, float scale, int bits,
                      float* out, bool accumulate) {
  // The same inverse and operations as minmax_decoded_max.
  const ScaleField f = scale_field(scale);
  const float inv = f.scale > 0.0f ? 1.0f / f.scale : 0.0f;
  const unsigned char* q = codes;
  if (bits != 8) {  // unpack to one byte per code, then the 8-bit path
    unsigned char* unpacked = scratch_codes(len).data();
    switch (bits) {
      case 4:
        unpack<4>(codes, len, unpacked);
        break;
      case 2:
        unpack<2>(codes, len, unpacked);
        break;
      default:
        unpack<1>(codes, len, unpacked);
        break;
    }
    q = unpacked;
  }
  const int64_t done = has_avx2() ? dequantize8_avx2(q, len, min, inv, f.down, out, accumulate) : 0;
  for (int64_t i = done; i < len; ++i) {
    const float v = min + (static_cast<float>(q[i]) * inv) * f.down;
    out[i] = accumulate ? out[i] + v : v;
  }
}

namespace {
__attribute__((target("avx2"))) double sum_of_squares_avx2(const float* x, int64_t len,
                                                           int64_t* done) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd()};
  int64_t i = 0;
  for (; i + 16 <= len; i += 16) {
    for (int k = 0; k < 4; ++k) {
      const __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4 * k));
      acc[k] = _mm256_add_pd(_mm256_mul_pd(v, v), acc[k]);  // the square is exact
    }
  }
  *done = i;
  alignas(32) double lanes[4][4];
  for (int k = 0; k < 4; ++k) _mm256_store_pd(lanes[k], acc[k]);
  double sum = 0;
  for (int k = 0; k < 4; ++k)
    for (int l = 0; l < 4; ++l) sum += lanes[k][l];
  return sum;
}
}  // namespace

double sum_of_squares(const float* x, int64_t len) {
  int64_t done = 0;
  double sum = 0;
  if (has_avx2()) {
    sum = sum_of_squares_avx2(x, len, &done);
  } else {
    // The same order as the AVX2 path: 16 partial sums, element i in sum
    // i % 16, then the tail.
    double partial[16] = {};
    for (; done + 16 <= len; done += 16)
      for (int j = 0; j < 16; ++j) partial[j] += double{x[done + j]} * double{x[done + j]};
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 4; ++l) sum += partial[4 * k + l];
  }
  for (int64_t i = done; i < len; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

void sign_pack(const float* x, int64_t len, unsigned char* bits) {
  const int64_t done = has_avx2() ? sign_pack_avx2(x, len, bits) : 0;
  if (done < len) std::memset(bits + done / 8, 0, static_cast<size_t>((len - done + 7) / 8));
  for (int64_t i = done; i < len; ++i)
    if (std::signbit(x[i])) bits[i / 8] |= static_cast<unsigned char>(1u << (i % 8));
}

void sign_unpack(const unsigned char* bits, int64_t len, float scale, float* out, bool accumulate) {
  const int64_t done = has_avx2() ? sign_unpack_avx2(bits, len, scale, out, accumulate) : 0;
  for (int64_t i = done; i < len; ++i) {
    const float v = (bits[i / 8] >> (i % 8)) & 1 ? -scale : scale;
    out[i] = accumulate ? out[i] + v : v;
  }
}

}  // namespace relaxcc::kernels::cpu
