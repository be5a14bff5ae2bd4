#include "relaxcc/dtype.h"

#include <charconv>
#include <string>

#include "relaxcc/errors.h"
#include "relaxcc/tensor.h"

namespace relaxcc {

std::string_view dtype_name(DType t) noexcept {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::f64:
      return "f64";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::u8:
      return "u8";
  }
  return "invalid";
}

DType parse_dtype(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType type;
  };
  static constexpr Alias kAliases[] = {
      {"f32", DType::f32},    {"float", DType::f32},     {"float32", DType::f32},
      {"f16", DType::f16},    {"half", DType::f16},      {"float16", DType::f16},
      {"bf16", DType::bf16},  {"bfloat16", DType::bf16}, {"f64", DType::f64},
      {"double", DType::f64}, {"float64", DType::f64},   {"i32", DType::i32},
      {"int", DType::i32},    {"int32", DType::i32},     {"i64", DType::i64},
      {"int64", DType::i64},  {"u8", DType::u8},         {"uint8", DType::u8},
  };
  for (const auto& a : kAliases)
    if (a.name == name) return a.type;
  RELAXCC_THROW(InvalidArgument, "unknown dtype '", name,
                "': expected f32, f16, bf16, f64, i32, i64 or u8");
}

std::ostream& operator<<(std::ostream& os, DType t) {
  return os << dtype_name(t);
}

std::string to_string(Device d) {
  return d.is_host() ? std::string("host") : "cuda:" + std::to_string(d.index);
}

Device parse_device(std::string_view name) {
  if (name == "host" || name == "cpu") return Device::host();
  if (name == "cuda") return Device::cuda(0);
  if (name.starts_with("cuda:")) {
    int index = -1;
    const auto digits = name.substr(5);
    const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && ptr == digits.data() + digits.size() && index >= 0)
      return Device::cuda(index);
  }
  RELAXCC_THROW(InvalidArgument, "unknown device '", name, "': expected host or cuda:N");
}

std::ostream& operator<<(std::ostream& os, Device d) {
  return os << to_string(d);
}

TensorView TensorView::slice(int64_t offset, int64_t count) const {
  RELAXCC_ENFORCE(offset >= 0 && count >= 0 && offset + count <= numel, InvalidArgument, "slice [",
                  offset, ", ", offset + count, ") of a tensor of ", numel,
                  " elements is out of bounds");
  TensorView out = *this;
  out.data = count == 0 ? data : static_cast<char*>(data) + offset * dtype_size(dtype);
  out.numel = count;
  return out;
}

void TensorView::check_valid(const char* what) const {
  RELAXCC_ENFORCE_GE(numel, 0, InvalidArgument, what, ": negative element count");
  RELAXCC_ENFORCE(data != nullptr || numel == 0, InvalidArgument, what, ": null data with ", numel,
                  " elements");
}

}  // namespace relaxcc

#include "relaxcc/reduce_op.h"

namespace relaxcc {

std::string_view reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
  }
  return "invalid";
}

ReduceOp parse_reduce_op(std::string_view name) {
  for (ReduceOp op : kAllReduceOps)
    if (reduce_op_name(op) == name) return op;
  if (name == "prod") RELAXCC_THROW(Unsupported, "reduce op 'prod' is not supported");
  RELAXCC_THROW(InvalidArgument, "unknown reduce op '", name, "': expected sum, avg, min or max");
}

std::ostream& operator<<(std::ostream& os, ReduceOp op) {
  return os << reduce_op_name(op);
}

}  // namespace relaxcc
