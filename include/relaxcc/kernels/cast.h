// Element-type conversion kernels: f32 <-> f16 and f32 <-> bf16, plus a plain
// copy when both dtypes are equal. Results match the scalar reference in
// relaxcc/half.h bit for bit on every backend (CPU scalar, CPU F16C, CUDA).
#pragma once

#include "relaxcc/exec_context.h"
#include "relaxcc/tensor.h"

namespace relaxcc::kernels {

// out[i] = convert(in[i]). Both views must have the same numel and live on
// ctx.device. On cuda devices the kernel is enqueued on ctx.stream. Throws
// InvalidArgument for mismatched views, Unsupported for other dtype pairs or
// a device this build cannot reach.
void cast(const TensorView& in, const TensorView& out, const ExecContext& ctx);

// Which CPU path cast() takes for f16 ("f16c" or "scalar").
const char* cpu_f16_path() noexcept;

}  // namespace relaxcc::kernels
