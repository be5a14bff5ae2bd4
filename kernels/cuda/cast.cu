// f32 <-> f16/bf16 on CUDA devices. The device code runs the same constexpr
// conversions as the CPU reference (relaxcc/half.h), so results agree bit for
// bit, NaN payloads included.
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_kernels.h"
#include "relaxcc/errors.h"
#include "relaxcc/half.h"

namespace relaxcc::kernels::cuda {

namespace {

template <typename Convert, typename In, typename Out>
__global__ void convert_kernel(const In* in, Out* out, int64_t n, Convert convert) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
    out[i] = convert(in[i]);
}

template <typename Convert, typename In, typename Out>
void launch(const In* in, Out* out, int64_t n, cudaStream_t stream, Convert convert) {
  if (n == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(blocks < 65535 ? blocks : 65535);
  convert_kernel<<<grid, kThreads, 0, stream>>>(in, out, n, convert);
  const cudaError_t err = cudaGetLastError();
  RELAXCC_ENFORCE(err == cudaSuccess, CommunicationError,
                  "CUDA cast kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace

void cast(const TensorView& in, const TensorView& out, void* stream_ptr) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  const auto* in16 = static_cast<const uint16_t*>(in.data);
  const auto* in32 = static_cast<const float*>(in.data);
  auto* out16 = static_cast<uint16_t*>(out.data);
  auto* out32 = static_cast<float*>(out.data);
  if (in.dtype == DType::f32 && out.dtype == DType::f16)
    return launch(in32, out16, in.numel, stream,
                  [] __device__(float x) { return f32_to_f16_bits(x); });
  if (in.dtype == DType::f16 && out.dtype == DType::f32)
    return launch(in16, out32, in.numel, stream,
                  [] __device__(uint16_t h) { return f16_bits_to_f32(h); });
  if (in.dtype == DType::f32 && out.dtype == DType::bf16)
    return launch(in32, out16, in.numel, stream,
                  [] __device__(float x) { return f32_to_bf16_bits(x); });
  if (in.dtype == DType::bf16 && out.dtype == DType::f32)
    return launch(in16, out32, in.numel, stream,
                  [] __device__(uint16_t b) { return bf16_bits_to_f32(b); });
  RELAXCC_THROW(Unsupported, "CUDA cast from ", in.dtype, " to ", out.dtype);
}

}  // namespace relaxcc::kernels::cuda
