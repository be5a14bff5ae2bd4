// BucketMemory: where the Reducer's buckets live and how bytes move between
// gradients and buckets, for the device its tensors are on. The Reducer is
// written once against this interface; bucket_memory(device) picks the host
// implementation (memcpy and memset on the calling thread: the host path as
// it was) or the CUDA one (kernels/cuda/cuda_kernels.h).
//
// The CUDA implementation owns a copy stream and one readiness event per
// tensor, made with it, on the Reducer's device:
//   - record_ready(i) records tensor i's event on the producer stream (the
//     Reducer's ExecContext::stream, where backward computes gradients): the
//     host never waits for the gradient;
//   - await_ready(i) makes the copy stream wait on that event, and copy_in
//     then copies on the copy stream, so a gradient reaches its bucket once
//     the producer computed it;
//   - bucket_context() is the ExecContext the algorithm's operations on
//     buckets get: the copy stream, so that a bucket's collective (an NCCL
//     communicator waits on the context's stream with an event) runs after
//     the copies into it, while later gradients are still being computed;
//   - publish() makes the producer stream wait for every copy enqueued so
//     far (results copied back into gradients), again without a host wait.
// Every call makes the device current and gives the calling thread its own
// device back. A failing CUDA call throws DeviceError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "relaxcc/exec_context.h"
#include "relaxcc/tensor.h"

namespace relaxcc::buckets {

class BucketMemory {
 public:
  virtual ~BucketMemory() = default;

  virtual Device device() const noexcept = 0;
  // The context given to the algorithm (AlgorithmContext::exec).
  virtual ExecContext bucket_context() const = 0;
  // `bytes` zeroed bytes on this device, owned by the view: bucket memory
  // when the communicator has none to give.
  virtual TensorView allocate(int64_t bytes) = 0;

  // Tensor `index`'s gradient has been enqueued on the producer stream.
  virtual void record_ready(int index) = 0;
  // Copies enqueued from now on run after tensor `index`'s record_ready.
  virtual void await_ready(int index) = 0;
  // Copies enqueued from now on run after everything enqueued on the
  // producer stream so far.
  virtual void acquire() = 0;
  // await_ready(index), then dst = src.
  virtual void copy_in(int index, void* dst, const void* src, size_t bytes) = 0;
  // dst = src (both on this device), in copy order.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // `bytes` zero bytes at dst, in copy order.
  virtual void zero(void* dst, size_t bytes) = 0;
  // The bytes at `src`, read on the host once the copies before completed.
  virtual std::vector<unsigned char> read(const void* src, size_t bytes) = 0;
  // Writes `bytes` at dst, in copy order; returns once written.
  virtual void write(void* dst, const std::vector<unsigned char>& bytes) = 0;
  // Work enqueued on the producer stream from now on sees every copy so far.
  virtual void publish() = 0;
  // Waits on the host until every copy so far completed.
  virtual void finish() = 0;
};

// The host implementation for host tensors; for CUDA tensors, the CUDA one on
// exec.stream as the producer stream, with `tensors` readiness events. A
// build without CUDA gives an implementation whose calls throw Unsupported.
std::unique_ptr<BucketMemory> bucket_memory(const ExecContext& exec, Device device, size_t tensors);

}  // namespace relaxcc::buckets
