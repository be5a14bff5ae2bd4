// Reduction operators of collectives.
#pragma once

#include <cstdint>
#include <ostream>
#include <string_view>

namespace relaxcc {

// sum, min and max apply element-wise. avg is sum divided by the number of
// ranks; integer averages truncate toward zero. f16 and bf16 are reduced in
// f32 and rounded back to nearest-even.
enum class ReduceOp : uint8_t { sum = 0, avg = 1, min = 2, max = 3 };
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min,
                                             ReduceOp::max};

std::string_view reduce_op_name(ReduceOp op) noexcept;
// Throws InvalidArgument for an unknown name.
ReduceOp parse_reduce_op(std::string_view name);
std::ostream& operator<<(std::ostream& os, ReduceOp op);

}  // namespace relaxcc
