// Element conversions for code written over the C++ types of the dtypes
// (visit_dtype in relaxcc/dtype.h): test data, expected results, averages
// computed in double. Header only.
#pragma once

#include <type_traits>

#include "relaxcc/half.h"

namespace relaxcc {

// from_double: `v` as a T, a plain conversion (f16 and bf16 round through
// f32 to nearest even, as to_half and to_bfloat16 do). same_element: a == b,
// f16 and bf16 compared by their bits (they have no ==).
template <typename T>
constexpr T from_double(double v) noexcept {
  if constexpr (std::is_same_v<T, Half>)
    return to_half(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, BFloat16>)
    return to_bfloat16(static_cast<float>(v));
  else
    return static_cast<T>(v);
}
template <typename T>
constexpr bool same_element(T a, T b) noexcept {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return a.bits == b.bits;
  else
    return a == b;
}

}  // namespace relaxcc
