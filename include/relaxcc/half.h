// IEEE binary16 (f16) and bfloat16 (bf16) storage types with exact
// conversions to and from f32.
//
// f32 -> f16/bf16 rounds to nearest, ties to even; produces f16 subnormals
// and signed zeros exactly; overflows to infinity; NaN stays NaN with the
// quiet bit set and the top payload bits kept. f16/bf16 -> f32 is exact
// (a signaling NaN comes back quiet). These functions are the reference that
// the vectorized CPU kernels and the CUDA kernels match bit for bit.
#pragma once

#include <bit>
#include <cstdint>

namespace relaxcc {

struct Half {
  uint16_t bits = 0;
};
struct BFloat16 {
  uint16_t bits = 0;
};

constexpr uint16_t f32_to_f16_bits(float value) noexcept {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    if (abs == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs >= 0x38800000u) {                                              // normal f16 (>= 2^-14)
    // Rebias the exponent (127 -> 15) and round the 13 dropped bits to even.
    const uint32_t rounded = abs + 0x0fffu + ((abs >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the min subnormal
  // Subnormal f16: shift the full significand right and round to even.
  const uint32_t exponent = abs >> 23;  // 102..112
  const uint32_t significand = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exponent;  // 14..24
  const uint32_t half_ulp = 1u << (shift - 1);
  const uint32_t rest = significand & ((1u << shift) - 1u);
  uint32_t q = significand >> shift;
  if (rest > half_ulp || (rest == half_ulp && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

constexpr float f16_bits_to_f32(uint16_t h) noexcept {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) {
    const uint32_t quiet = mantissa != 0 ? 0x400000u : 0u;
    return std::bit_cast<float>(sign | 0x7f800000u | quiet | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);
    // Subnormal: normalise into an f32 normal.
    uint32_t e = 113;  // 127 - 15 + 1
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    return std::bit_cast<float>(sign | (e << 23) | ((mantissa & 0x3ffu) << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

constexpr uint16_t f32_to_bf16_bits(float value) noexcept {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  const uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

constexpr float bf16_bits_to_f32(uint16_t b) noexcept {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  if ((x & 0x7fffffffu) > 0x7f800000u) x |= 0x00400000u;
  return std::bit_cast<float>(x);
}

constexpr float to_f32(Half h) noexcept {
  return f16_bits_to_f32(h.bits);
}
constexpr float to_f32(BFloat16 b) noexcept {
  return bf16_bits_to_f32(b.bits);
}
constexpr Half to_half(float f) noexcept {
  return Half{f32_to_f16_bits(f)};
}
constexpr BFloat16 to_bfloat16(float f) noexcept {
  return BFloat16{f32_to_bf16_bits(f)};
}

}  // namespace relaxcc
