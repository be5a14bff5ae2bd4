// CPU kernel entry points behind the dispatchers in kernels/*.cc.
#pragma once

#include <cstdint>

#include "relaxcc/half.h"

namespace relaxcc::kernels::cpu {

void f32_to_f16(const float* in, uint16_t* out, int64_t n);
void f16_to_f32(const uint16_t* in, float* out, int64_t n);
void f32_to_bf16(const float* in, uint16_t* out, int64_t n);
void bf16_to_f32(const uint16_t* in, float* out, int64_t n);
bool has_f16c() noexcept;
bool has_avx2() noexcept;

}  // namespace relaxcc::kernels::cpu
