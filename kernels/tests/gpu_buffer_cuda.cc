#include <cuda_runtime.h>

#include "gpu_buffer.h"
#include "relaxcc/errors.h"

namespace relaxcc::test {

namespace {
void check(cudaError_t err, const char* what) {
  RELAXCC_ENFORCE(err == cudaSuccess, CommunicationError, what, ": ", cudaGetErrorString(err));
}
}  // namespace

GpuBuffer::GpuBuffer(const void* host, size_t bytes) : bytes_(bytes) {
  check(cudaMalloc(&ptr_, bytes), "cudaMalloc");
  if (host != nullptr) check(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}
GpuBuffer::~GpuBuffer() {
  cudaFree(ptr_);
}
void GpuBuffer::copy_to_host(void* host) const {
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check(cudaMemcpy(host, ptr_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy");
}

}  // namespace relaxcc::test
