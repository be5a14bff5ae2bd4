// What this process can reach of CUDA. Safe to call in every build: without
// CUDA, or without a driver or device, it reports zero devices and a reason.
#pragma once

#include <string>

namespace relaxcc::kernels {

struct CudaAvailability {
  int device_count = 0;
  std::string reason;  // why device_count is 0; empty otherwise
};
CudaAvailability cuda_availability() noexcept;

}  // namespace relaxcc::kernels
