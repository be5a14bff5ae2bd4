// CUDA kernel entry points. Defined by the .cu files when relaxcc is built
// with CUDA, and by kernels/cuda/unavailable.cc (raising Unsupported)
// otherwise; callers never test the build configuration.
#pragma once

#include <cstddef>
#include <span>

#include "relaxcc/kernels/compressor.h"
#include "relaxcc/tensor.h"

namespace relaxcc::kernels::cuda {

// Enqueues out = convert(in) on `stream` (a cudaStream_t).
void cast(const TensorView& in, const TensorView& out, void* stream);

// Compressors on device memory: `in`/`out` and the payload live on the
// device. Encode covers f16, bf16, minmax (nearest and stochastic rounding),
// randomk (gather) and topk (host selection, device gather); decode covers
// every kind (dequantize, scatter). Both validate on the device and
// synchronize `stream` to report errors.
size_t encode(const TensorView& in, std::span<std::byte> payload, const CompressorConfig& config,
              const PayloadHeader& header, void* stream, uint64_t rng_seed, uint64_t rng_offset);
void decode(std::span<const std::byte> payload, const TensorView& out, bool accumulate,
            void* stream);

}  // namespace relaxcc::kernels::cuda
