// Stand-ins for the CUDA entry points in a build without CUDA. They report
// the situation to the caller; they never pretend to run.
#include "kernels/cuda/cuda_kernels.h"
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
void topk_select(const float*, int64_t, int64_t, uint32_t*, float*, void*) {
  RELAXCC_THROW(Unsupported, "topk_select on a CUDA device: relaxcc was built without CUDA");
}

namespace {
[[noreturn]] void unavailable(const char* what) {
  RELAXCC_THROW(Unsupported, what, " on a CUDA device: relaxcc was built without CUDA");
}
}  // namespace

void set_device(int) {
  unavailable("cudaSetDevice");
}
std::shared_ptr<void> allocate(size_t, int, void*) {
  unavailable("device memory");
}
int get_device() {
  unavailable("cudaGetDevice");
}
std::shared_ptr<void> create_stream(int) {
  unavailable("stream");
}
std::shared_ptr<void> create_event(int) {
  unavailable("event");
}
void record_event(void*, void*) {
  unavailable("event record");
}
void wait_event(void*, void*) {
  unavailable("stream wait");
}
void copy_async(void*, const void*, size_t, void*) {
  unavailable("copy");
}
void fill_async(void*, unsigned char, size_t, void*) {
  unavailable("fill");
}
void synchronize(void*) {
  unavailable("stream synchronization");
}
void add(float*, const float*, int64_t, void*) {
  unavailable("add");
}
void sum(float*, const float*, const float*, int64_t, void*) {
  unavailable("sum");
}
void subtract_from(float*, const float*, int64_t, void*) {
  unavailable("subtract");
}
void scale(float*, int64_t, float, bool, void*) {
  unavailable("scale");
}
int64_t first_non_finite(const float*, int64_t, void*) {
  unavailable("finiteness check");
}
}  // namespace cuda

}  // namespace relaxcc::kernels
