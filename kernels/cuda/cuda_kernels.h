// CUDA kernel entry points. Defined by the .cu files when relaxcc is built
// with CUDA, and by kernels/cuda/unavailable.cc (raising Unsupported)
// otherwise; callers never test the build configuration.
#pragma once

#include "relaxcc/tensor.h"

namespace relaxcc::kernels::cuda {

// Enqueues out = convert(in) on `stream` (a cudaStream_t).
void cast(const TensorView& in, const TensorView& out, void* stream);

}  // namespace relaxcc::kernels::cuda
