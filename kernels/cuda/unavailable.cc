// Stand-ins for the CUDA entry points in a build without CUDA. They report
// the situation to the caller; they never pretend to run.
#include "cuda_kernels.h"
#include "relaxcc/errors.h"
#include "relaxcc/kernels/cuda_runtime.h"

namespace relaxcc::kernels {

CudaAvailability cuda_availability() noexcept {
  return {0, "relaxcc was built without CUDA (RELAXCC_WITH_CUDA)"};
}

namespace cuda {
void cast(const TensorView& in, const TensorView&, void*) {
  RELAXCC_THROW(Unsupported, "cast on ", in.device, ": relaxcc was built without CUDA");
}
size_t encode(const TensorView& in, std::span<std::byte>, const CompressorConfig&,
              const PayloadHeader&, void*, uint64_t, uint64_t) {
  RELAXCC_THROW(Unsupported, "encode on ", in.device, ": relaxcc was built without CUDA");
}
void decode(std::span<const std::byte>, const TensorView& out, bool, void*) {
  RELAXCC_THROW(Unsupported, "decode on ", out.device, ": relaxcc was built without CUDA");
}
}  // namespace cuda

}  // namespace relaxcc::kernels
