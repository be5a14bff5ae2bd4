// CUDA kernel entry points. Defined by the .cu files when relaxcc is built
// with CUDA, and by kernels/cuda/unavailable.cc (raising Unsupported)
// otherwise; callers never test the build configuration.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "relaxcc/kernels/compressor.h"
#include "relaxcc/tensor.h"

namespace relaxcc::kernels::cuda {

// Enqueues out = convert(in) on `stream` (a cudaStream_t).
void cast(const TensorView& in, const TensorView& out, void* stream);

// Compressors on device memory: `in`/`out` and the payload live on the
// device. Encode covers f16, bf16, minmax (nearest and stochastic rounding),
// randomk (gather) and topk (topk_select); decode covers every kind
// (dequantize, scatter). Both validate on the device and synchronize
// `stream` to report errors.
size_t encode(const TensorView& in, std::span<std::byte> payload, const CompressorConfig& config,
              const PayloadHeader& header, void* stream, uint64_t rng_seed, uint64_t rng_offset);
void decode(std::span<const std::byte> payload, const TensorView& out, bool accumulate,
            void* stream);

// Enqueues the top k of x's n elements by magnitude (kernels/cuda/topk.cu:
// an exact radix select), the same selection as kernels/cpu/topk.h bit for
// bit: every element whose |x| is above the k-th largest, then the
// lowest-index ones equal to it, in ascending index order, into indices[0,
// k) and their values into values[0, k). x must be finite (NaN and Inf are
// ordered by their bits, as if finite); 0 <= k <= n <= 2^32, else
// InvalidArgument. Nothing is read back to the host.
void topk_select(const float* x, int64_t n, int64_t k, uint32_t* indices, float* values,
                 void* stream);

// Device memory and element-wise kernels for the relaxed primitives' device
// path (kernels/cuda/device_ops.cu). `stream` is a cudaStream_t of the
// current device; pointers are device memory of that device (copy_async:
// either side may be host memory). A failing CUDA call throws DeviceError
// naming the call and the device. The arithmetic rounds each operation to
// nearest (no fused multiply-add), as the host kernels do.

// Makes `device` current on the calling thread (cudaSetDevice).
void set_device(int device);
// `bytes` of memory on `device` (cudaMallocAsync), zeroed in the order of
// `stream`: work enqueued there afterwards sees zeros (other streams: once
// `stream` was synchronized). The owner frees it (cudaFreeAsync on the
// device's legacy stream): release it once the work using it completed.
std::shared_ptr<void> allocate(size_t bytes, int device, void* stream);
// Enqueues a copy of `bytes` (cudaMemcpyDefault: any direction).
void copy_async(void* dst, const void* src, size_t bytes, void* stream);
// Enqueues setting `bytes` bytes at `dst` to `value`.
void fill_async(void* dst, unsigned char value, size_t bytes, void* stream);
// Waits for everything enqueued on `stream`.
void synchronize(void* stream);
// The calling thread's current device (cudaGetDevice).
int get_device();
// A non-blocking stream on `device`, destroyed (on that device) when the
// owner is released: release it once nothing enqueued there is pending.
std::shared_ptr<void> create_stream(int device);
// An event on `device` without timing, destroyed when the owner is released.
std::shared_ptr<void> create_event(int device);
// Records `event` on `stream` (both of the current device); no host wait.
void record_event(void* event, void* stream);
// Makes work enqueued on `stream` afterwards wait for `event`'s last
// record (cudaStreamWaitEvent); no host wait.
void wait_event(void* stream, void* event);
// Enqueue, over n elements: acc += x; out = x + y; r = e - r; x *= factor
// (divide: x /= factor).
void add(float* acc, const float* x, int64_t n, void* stream);
void sum(float* out, const float* x, const float* y, int64_t n, void* stream);
void subtract_from(float* r, const float* e, int64_t n, void* stream);
void scale(float* x, int64_t n, float factor, bool divide, void* stream);
// The smallest index of an Inf or NaN among x's n elements, or -1.
// Synchronizes `stream`.
int64_t first_non_finite(const float* x, int64_t n, void* stream);

}  // namespace relaxcc::kernels::cuda
