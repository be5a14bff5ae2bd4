// f32 <-> f16/bf16 on the CPU. f16 uses F16C (round-to-nearest-even in
// hardware) when the processor has it, bf16 AVX2, chosen at run time; the
// scalar loops are the reference and the fallback.
#include <cpuid.h>
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/cpu_kernels.h"

namespace relaxcc::kernels::cpu {

bool has_avx2() noexcept {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

bool has_avx512vl() noexcept {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  return yes;
}

bool has_f16c() noexcept {
  static const bool yes = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
    const bool f16c = (ecx & (1u << 29)) != 0;  // CPUID.1:ECX.F16C
    return f16c && __builtin_cpu_supports("avx2");
  }();
  return yes;
}

namespace {

__attribute__((target("avx2,f16c"))) void f32_to_f16_f16c(const float* in, uint16_t* out,
                                                          int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(in + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) out[i] = f32_to_f16_bits(in[i]);
}

__attribute__((target("avx2,f16c"))) void f16_to_f32_f16c(const uint16_t* in, float* out,
                                                          int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = f16_bits_to_f32(in[i]);
}

// Converts in[i] with Convert and checks that the input is finite and the
// result's exponent (kExponent) is not all ones: the reference for the
// vector paths' tails and the fallback.
template <uint16_t (*Convert)(float), uint16_t kExponent>
bool convert_finite_scalar(const float* in, uint16_t* out, int64_t n) {
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = Convert(in[i]);
    ok &= std::isfinite(in[i]) && (out[i] & kExponent) != kExponent;
  }
  return ok;
}

__attribute__((target("avx2,f16c"))) bool f32_to_f16_finite_f16c(const float* in, uint16_t* out,
                                                                 int64_t n) {
  const __m256i exp32 = _mm256_set1_epi32(0x7f800000);
  const __m128i exp16 = _mm_set1_epi16(0x7c00);
  __m256i bad_in = _mm256_setzero_si256();
  __m128i bad_out = _mm_setzero_si128();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(in + i);
    bad_in = _mm256_or_si256(
        bad_in, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), exp32), exp32));
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    bad_out = _mm_or_si128(bad_out, _mm_cmpeq_epi16(_mm_and_si128(h, exp16), exp16));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  const bool tail_ok = convert_finite_scalar<f32_to_f16_bits, 0x7c00>(in + i, out + i, n - i);
  return _mm256_testz_si256(bad_in, bad_in) && _mm_testz_si128(bad_out, bad_out) && tail_ok;
}

__attribute__((target("avx2"))) bool f32_to_bf16_finite_avx2(const float* in, uint16_t* out,
                                                             int64_t n) {
  const __m256i exp32 = _mm256_set1_epi32(0x7f800000);
  const __m256i round = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  __m256i bad = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i r[2];
    for (int h = 0; h < 2; ++h) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i + 8 * h));
      bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(x, exp32), exp32));
      // Round to nearest even, as f32_to_bf16_bits (finite inputs).
      const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
      r[h] = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, round), odd), 16);
      // A result with an all-ones exponent rounded to Inf.
      bad =
          _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(r[h], _mm256_set1_epi32(0x7f80)),
                                                  _mm256_set1_epi32(0x7f80)));
    }
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
  }
  const bool tail_ok = convert_finite_scalar<f32_to_bf16_bits, 0x7f80>(in + i, out + i, n - i);
  return _mm256_testz_si256(bad, bad) && tail_ok;
}

__attribute__((target("avx2"))) bool halves_finite_avx2(const uint16_t* bits, int64_t n,
                                                        uint16_t mask) {
  const __m256i m = _mm256_set1_epi16(static_cast<short>(mask));
  __m256i bad = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bits + i));
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi16(_mm256_and_si256(h, m), m));
  }
  bool ok = _mm256_testz_si256(bad, bad);
  for (; i < n; ++i) ok &= (bits[i] & mask) != mask;
  return ok;
}

__attribute__((target("avx2"))) void bf16_to_f32_avx2(const uint16_t* in, float* out, int64_t n) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet = _mm256_set1_epi32(0x00400000);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))), 16);
    // NaNs come back quiet, as bf16_bits_to_f32 makes them.
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(w, abs_mask), inf);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_or_si256(w, _mm256_and_si256(nan, quiet)));
  }
  for (; i < n; ++i) out[i] = bf16_bits_to_f32(in[i]);
}

}  // namespace

bool f32_to_f16_finite(const float* in, uint16_t* out, int64_t n) {
  if (has_f16c()) return f32_to_f16_finite_f16c(in, out, n);
  return convert_finite_scalar<f32_to_f16_bits, 0x7c00>(in, out, n);
}

bool f32_to_bf16_finite(const float* in, uint16_t* out, int64_t n) {
  if (has_avx2()) return f32_to_bf16_finite_avx2(in, out, n);
  return convert_finite_scalar<f32_to_bf16_bits, 0x7f80>(in, out, n);
}

bool halves_finite(const uint16_t* bits, int64_t n, bool bf16) {
  const uint16_t mask = bf16 ? 0x7f80 : 0x7c00;
  if (has_avx2()) return halves_finite_avx2(bits, n, mask);
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) ok &= (bits[i] & mask) != mask;
  return ok;
}

void f32_to_f16(const float* in, uint16_t* out, int64_t n) {
  if (has_f16c()) return f32_to_f16_f16c(in, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_f16_bits(in[i]);
}

void f16_to_f32(const uint16_t* in, float* out, int64_t n) {
  if (has_f16c()) return f16_to_f32_f16c(in, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = f16_bits_to_f32(in[i]);
}

void f32_to_bf16(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16_bits(in[i]);
}

void bf16_to_f32(const uint16_t* in, float* out, int64_t n) {
  if (has_avx2()) return bf16_to_f32_avx2(in, out, n);
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits_to_f32(in[i]);
}

}  // namespace relaxcc::kernels::cpu
