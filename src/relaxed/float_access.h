// Element access in double for the floating dtypes the relaxed primitives
// average (f32, f64, f16, bf16).
#pragma once

#include <type_traits>

#include "relaxcc/dtype.h"
#include "relaxcc/element_cast.h"
#include "relaxcc/half.h"

namespace relaxcc::relaxed {

template <typename T>
inline constexpr bool kAveraged =
    std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

template <typename T>
double load(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return to_f32(p[i]);
  else
    return static_cast<double>(p[i]);
}

template <typename T>
void store(T* p, int64_t i, double v) {
  p[i] = from_double<T>(v);
}

// Calls fn(T{}) for a floating dtype; nothing for others.
template <typename Fn>
void visit_averaged(DType dtype, Fn&& fn) {
  visit_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (kAveraged<T>) fn(tag);
  });
}

}  // namespace relaxcc::relaxed
