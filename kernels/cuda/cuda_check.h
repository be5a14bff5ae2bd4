// Turns a CUDA runtime error into relaxcc's DeviceError, naming the call and
// the calling thread's current device. For the .cu files only (it needs
// cuda_runtime.h).
#pragma once

#include <cuda_runtime.h>

#include "relaxcc/errors.h"

namespace relaxcc::kernels::cuda {

// The device the calling thread has made current (-1 when unknown), for messages.
inline int current_device() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) return -1;
  return device;
}

// Throws DeviceError "<call> on cuda:<device>: <name> (<description>)"
// unless `err` is cudaSuccess.
inline void check(cudaError_t err, const char* call) {
  RELAXCC_ENFORCE(err == cudaSuccess, DeviceError, call, " on cuda:", current_device(), ": ",
                  cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

}  // namespace relaxcc::kernels::cuda
