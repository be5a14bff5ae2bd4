// f32 <-> f16/bf16 on the CPU. f16 uses F16C (round-to-nearest-even in
// hardware) when the processor has it, chosen at run time; bf16 is a scalar
// loop that the compiler vectorizes.
#include <cpuid.h>
#include <immintrin.h>

#include "cpu_kernels.h"

namespace relaxcc::kernels::cpu {

bool has_avx2() noexcept {
  static const bool yes = __builtin_cpu_supports("avx2");
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

}  // namespace

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
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits_to_f32(in[i]);
}

}  // namespace relaxcc::kernels::cpu
