// Device memory for GPU kernel tests (gpu_buffer_cuda.cc with CUDA,
// gpu_buffer_none.cc without; tests call it only after cuda_availability()
// reported a device).
#pragma once

#include <cstddef>

namespace relaxcc::test {

class GpuBuffer {
 public:
  // Allocates `bytes` on device 0 and copies `host` into it when non-null.
  GpuBuffer(const void* host, size_t bytes);
  ~GpuBuffer();
  GpuBuffer(const GpuBuffer&) = delete;
  GpuBuffer& operator=(const GpuBuffer&) = delete;
  void* get() const noexcept { return ptr_; }
  // Waits for the device, then copies the whole buffer out.
  void copy_to_host(void* host) const;

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace relaxcc::test
