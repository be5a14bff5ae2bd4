// CPU kernel entry points behind the dispatchers in kernels/*.cc.
#pragma once

#include <cstdint>

#include "relaxcc/half.h"

namespace relaxcc::kernels::cpu {

void f32_to_f16(const float* in, uint16_t* out, int64_t n);
void f16_to_f32(const uint16_t* in, float* out, int64_t n);
void f32_to_bf16(const float* in, uint16_t* out, int64_t n);
void bf16_to_f32(const uint16_t* in, float* out, int64_t n);
// One pass that encodes and checks: false when an input is not finite or an
// output rounds to Inf (the caller then finds which, for its message; `out`
// holds the conversion of every element either way).
bool f32_to_f16_finite(const float* in, uint16_t* out, int64_t n);
bool f32_to_bf16_finite(const float* in, uint16_t* out, int64_t n);
// Whether every f16 (bf16: `bf16`) of `bits` is finite.
bool halves_finite(const uint16_t* bits, int64_t n, bool bf16);
bool has_f16c() noexcept;
bool has_avx2() noexcept;
// AVX-512 F and VL (256-bit EVEX forms: three-way XOR, 32 registers).
bool has_avx512vl() noexcept;

}  // namespace relaxcc::kernels::cpu
