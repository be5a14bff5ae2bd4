// Device memory and element-wise kernels of the relaxed primitives' device
// path (src/relaxed/device_backend.cc): allocation, copies, error-feedback
// updates, accumulation, scaling and a finiteness check. The arithmetic uses
// the round-to-nearest intrinsics (__fadd_rn, __fsub_rn, __fmul_rn,
// __fdiv_rn): no fused multiply-add, so results equal the host's
// (-ffp-contract=off) bit for bit.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "relaxcc/errors.h"

namespace relaxcc::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// A grid-stride launch of at most 65535 blocks.
unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

__global__ void add_kernel(float* acc, const float* x, int64_t n) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
    acc[i] = __fadd_rn(acc[i], x[i]);
}

__global__ void sum_kernel(float* out, const float* x, const float* y, int64_t n) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
    out[i] = __fadd_rn(x[i], y[i]);
}

__global__ void subtract_from_kernel(float* r, const float* e, int64_t n) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
    r[i] = __fsub_rn(e[i], r[i]);
}

__global__ void scale_kernel(float* x, int64_t n, float factor, int divide) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
    x[i] = divide ? __fdiv_rn(x[i], factor) : __fmul_rn(x[i], factor);
}

// Lowers *first to the smallest index of a non-finite element (atomicMin).
__global__ void first_non_finite_kernel(const float* x, int64_t n, unsigned long long* first) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
    if (!isfinite(x[i])) atomicMin(first, static_cast<unsigned long long>(i));
}

void launched(const char* kernel) {
  check(cudaGetLastError(), kernel);
}

}  // namespace

void set_device(int device) {
  RELAXCC_ENFORCE(device >= 0, InvalidArgument, "CUDA device index ", device, ", expected >= 0");
  const cudaError_t err = cudaSetDevice(device);
  RELAXCC_ENFORCE(err == cudaSuccess, DeviceError, "cudaSetDevice(", device,
                  "): ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

std::shared_ptr<void> allocate(size_t bytes, int device, void* stream_ptr) {
  set_device(device);
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  void* ptr = nullptr;
  check(cudaMallocAsync(&ptr, bytes > 0 ? bytes : 1, stream), "cudaMallocAsync");
  // Freed in stream order on the device's legacy stream: no device-wide
  // synchronization (cudaFree would wait for kernels that wait on peers).
  std::shared_ptr<void> owner(ptr, [device](void* p) {
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
    if (previous != device) (void)cudaSetDevice(device);
    (void)cudaFreeAsync(p, nullptr);
    if (previous != device && previous >= 0) (void)cudaSetDevice(previous);
  });
  check(cudaMemsetAsync(ptr, 0, bytes > 0 ? bytes : 1, stream), "cudaMemsetAsync");
  return owner;
}

int get_device() {
  int device = -1;
  check(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

namespace {
// Runs `fn` with `device` current, then puts the caller's device back
// (for deleters, which must not throw).
template <typename Fn>
void on_device_quietly(int device, Fn fn) noexcept {
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) previous = -1;
  if (previous != device) (void)cudaSetDevice(device);
  fn();
  if (previous != device && previous >= 0) (void)cudaSetDevice(previous);
}
}  // namespace

std::shared_ptr<void> create_stream(int device) {
  set_device(device);
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return std::shared_ptr<void>(stream, [device](void* s) {
    on_device_quietly(device, [s] { (void)cudaStreamDestroy(static_cast<cudaStream_t>(s)); });
  });
}

std::shared_ptr<void> create_event(int device) {
  set_device(device);
  cudaEvent_t event = nullptr;
  check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  return std::shared_ptr<void>(event, [device](void* e) {
    on_device_quietly(device, [e] { (void)cudaEventDestroy(static_cast<cudaEvent_t>(e)); });
  });
}

void record_event(void* event, void* stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)),
        "cudaEventRecord");
}

void wait_event(void* stream, void* event) {
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0),
        "cudaStreamWaitEvent");
}

void copy_async(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
        "cudaMemcpyAsync");
}

void fill_async(void* dst, unsigned char value, size_t bytes, void* stream) {
  if (bytes == 0) return;
  check(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
}

void synchronize(void* stream) {
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

void add(float* acc, const float* x, int64_t n, void* stream) {
  if (n <= 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(acc, x, n);
  launched("add kernel launch");
}

void sum(float* out, const float* x, const float* y, int64_t n, void* stream) {
  if (n <= 0) return;
  sum_kernel<<<grid_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(out, x, y, n);
  launched("sum kernel launch");
}

void subtract_from(float* r, const float* e, int64_t n, void* stream) {
  if (n <= 0) return;
  subtract_from_kernel<<<grid_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(r, e, n);
  launched("subtract kernel launch");
}

void scale(float* x, int64_t n, float factor, bool divide, void* stream) {
  if (n <= 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, n, factor,
                                                                                divide ? 1 : 0);
  launched("scale kernel launch");
}

int64_t first_non_finite(const float* x, int64_t n, void* stream_ptr) {
  if (n <= 0) return -1;
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  unsigned long long* first = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&first), sizeof(*first), stream),
        "cudaMallocAsync");
  // All ones: no element found (any index found is below it).
  constexpr unsigned long long none = ~0ull;
  unsigned long long found = none;
  cudaError_t err = cudaMemsetAsync(first, 0xff, sizeof *first, stream);
  if (err == cudaSuccess) {
    first_non_finite_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, n, first);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess)
    err = cudaMemcpyAsync(&found, first, sizeof found, cudaMemcpyDeviceToHost, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  const cudaError_t freed = cudaFreeAsync(first, stream);
  check(err, "finiteness check");
  check(freed, "cudaFreeAsync");
  return found == none ? -1 : static_cast<int64_t>(found);
}

}  // namespace relaxcc::kernels::cuda
