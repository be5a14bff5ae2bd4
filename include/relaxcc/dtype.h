// Element types and devices.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

#include "relaxcc/half.h"

namespace relaxcc {

enum class DType : uint8_t { f32 = 0, f16 = 1, bf16 = 2, f64 = 3, i32 = 4, i64 = 5, u8 = 6 };
inline constexpr int kNumDTypes = 7;
inline constexpr DType kAllDTypes[kNumDTypes] = {DType::f32, DType::f16, DType::bf16, DType::f64,
                                                 DType::i32, DType::i64, DType::u8};

constexpr size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::u8:
      return 1;
  }
  return 0;
}
constexpr bool is_floating(DType t) noexcept {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f64;
}

std::string_view dtype_name(DType t) noexcept;
// Accepts the canonical names (f32, bf16, ...) and the common aliases
// (float, half, double, int32, int64, uint8). Throws InvalidArgument.
DType parse_dtype(std::string_view name);
std::ostream& operator<<(std::ostream& os, DType t);

// The C++ type behind a dtype, and back.
template <DType T>
struct DTypeTraits;
template <>
struct DTypeTraits<DType::f32> {
  using type = float;
};
template <>
struct DTypeTraits<DType::f16> {
  using type = Half;
};
template <>
struct DTypeTraits<DType::bf16> {
  using type = BFloat16;
};
template <>
struct DTypeTraits<DType::f64> {
  using type = double;
};
template <>
struct DTypeTraits<DType::i32> {
  using type = int32_t;
};
template <>
struct DTypeTraits<DType::i64> {
  using type = int64_t;
};
template <>
struct DTypeTraits<DType::u8> {
  using type = uint8_t;
};
template <DType T>
using dtype_t = typename DTypeTraits<T>::type;

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<Half>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}

// Calls fn(T{}) with a value of the C++ type of `t`.
template <typename Fn>
decltype(auto) visit_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32:
      return fn(float{});
    case DType::f16:
      return fn(Half{});
    case DType::bf16:
      return fn(BFloat16{});
    case DType::f64:
      return fn(double{});
    case DType::i32:
      return fn(int32_t{});
    case DType::i64:
      return fn(int64_t{});
    case DType::u8:
      break;
  }
  return fn(uint8_t{});
}

// Where tensor memory lives: the host, or CUDA device N.
struct Device {
  enum class Kind : uint8_t { host = 0, cuda = 1 };
  Kind kind = Kind::host;
  int index = 0;

  static constexpr Device host() noexcept { return {}; }
  static constexpr Device cuda(int index) noexcept { return {Kind::cuda, index}; }
  constexpr bool is_host() const noexcept { return kind == Kind::host; }
  constexpr bool is_cuda() const noexcept { return kind == Kind::cuda; }
  friend constexpr bool operator==(const Device&, const Device&) = default;
};
std::string to_string(Device d);
// "host", "cpu", "cuda", or "cuda:N". Throws InvalidArgument.
Device parse_device(std::string_view name);
std::ostream& operator<<(std::ostream& os, Device d);

}  // namespace relaxcc
