// Element-wise reduction kernels used by the collectives.
#pragma once

#include "relaxcc/exec_context.h"
#include "relaxcc/reduce_op.h"
#include "relaxcc/tensor.h"

namespace relaxcc::kernels {

// out[i] = a[i] op b[i] in one pass, for sum, min and max; avg combines as
// sum (divide once at the end with finish_average). `out` may alias `a` or
// `b`. f16/bf16 are computed in f32 and rounded to nearest-even. Throws
// InvalidArgument when the views differ in numel or dtype.
void combine(const TensorView& out, const TensorView& a, const TensorView& b, ReduceOp op,
             const ExecContext& ctx);

// dst[i] = dst[i] op src[i]: combine(dst, dst, src, op, ctx).
void reduce_into(const TensorView& dst, const TensorView& src, ReduceOp op, const ExecContext& ctx);

// dst[i] /= divisor, in f32 for f16/bf16 and truncating toward zero for
// integers.
void finish_average(const TensorView& dst, int64_t divisor, const ExecContext& ctx);

}  // namespace relaxcc::kernels
