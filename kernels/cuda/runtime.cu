#include <cuda_runtime.h>

#include "relaxcc/kernels/cuda_runtime.h"

namespace relaxcc::kernels {

CudaAvailability cuda_availability() noexcept {
  CudaAvailability out;
  const cudaError_t err = cudaGetDeviceCount(&out.device_count);
  if (err != cudaSuccess) {
    out.device_count = 0;
    out.reason = std::string("CUDA runtime reports: ") + cudaGetErrorString(err);
  } else if (out.device_count == 0) {
    out.reason = "no CUDA device is visible";
  }
  return out;
}

}  // namespace relaxcc::kernels
