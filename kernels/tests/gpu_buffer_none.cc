#include "gpu_buffer.h"
#include "relaxcc/errors.h"

namespace relaxcc::test {

GpuBuffer::GpuBuffer(const void*, size_t) {
  RELAXCC_THROW(Unsupported, "GpuBuffer: relaxcc was built without CUDA");
}
GpuBuffer::~GpuBuffer() = default;
void GpuBuffer::copy_to_host(void*) const {}

}  // namespace relaxcc::test
