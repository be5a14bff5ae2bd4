// TensorBackend: what the relaxed primitives' schedules do to tensor memory,
// for the device a tensor lives on. The schedules (compressed_allreduce.cc,
// sparse_allreduce.cc) are written once against this interface; tensor_backend(device) picks the
// host kernels (relaxcc/kernels/compressor.h on host memory) or the CUDA
// kernels (kernels/cuda/cuda_kernels.h on device memory, ordered on
// ExecContext::stream). Both produce the same bits: the CUDA kernels match
// the host kernels bit for bit (no fused multiply-add), so a schedule run on
// either backend with the same data gives the same payloads, results and
// error-feedback residuals.
//
// Views given to a backend are f32 (values) or u8 (payload bytes) on its
// device; payload spans point into such views. A failing CUDA call throws
// DeviceError; a corrupt payload CorruptPayload (validated on the device,
// reported before anything is written), as the decoder contract says.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "relaxcc/communicator.h"
#include "relaxcc/kernels/compressor.h"

namespace relaxcc::relaxed {

class TensorBackend {
 public:
  virtual ~TensorBackend() = default;

  virtual Device device() const noexcept = 0;

  // True when a stage must see its data on the host before it may finish:
  // the CUDA kernels validate on the device and read their flags back, so a
  // schedule on this backend is stepped on the calling thread (each stage
  // run once the transfers it reads completed) instead of submitted at once
  // as Communicator::compute stages.
  virtual bool stepped() const noexcept = 0;

  // `numel` elements of `dtype` on this device, owning their memory, zeroed
  // for what is enqueued on ctx afterwards. Released once no enqueued work
  // uses them (the schedules synchronize before dropping a view).
  virtual TensorView zeros(int64_t numel, DType dtype, const ExecContext& ctx) const = 0;
  // `bytes` of zeroed payload memory for `comm`'s collectives: host memory
  // from comm.host_scratch() (reused call after call), or device memory
  // from comm.allocate() (0 bytes: only the check, an NCCL communicator
  // allocates nothing). Throws Unsupported naming `what`,
  // the rank and the device when `comm` does not move memory of this device
  // (an MPI communicator given device tensors).
  virtual TensorView payload_memory(Communicator& comm, int64_t bytes, const char* what) const = 0;
  // payload_memory's check alone, allocating nothing (a call that moves
  // nothing still refuses a communicator that cannot move its tensor).
  virtual void check_communicator(Communicator& comm, const char* what) const = 0;

  // dst = src (same bytes; either may be host memory on a device backend).
  virtual void copy(void* dst, const void* src, size_t bytes, const ExecContext& ctx) const = 0;
  // Sets `bytes` bytes at `dst` to `value`.
  virtual void fill(void* dst, unsigned char value, size_t bytes, const ExecContext& ctx) const = 0;
  // Waits until everything this backend enqueued on ctx finished (host:
  // nothing to wait for).
  virtual void finish(const ExecContext& ctx) const = 0;

  // The payload's header, checked against its size (CorruptPayload).
  virtual kernels::PayloadHeader read_header(std::span<const std::byte> payload,
                                             const ExecContext& ctx) const = 0;
  // Encodes `in` into `out` (encoded_size bytes). With a `residual` (in.numel
  // elements; an empty view: none) it is added first and left holding what the
  // payload misses, `scratch` (in.numel elements) overwritten: error
  // feedback as in relaxcc/kernels/error_feedback.h. An input the codec
  // refuses leaves the residual as it was.
  virtual void encode(const TensorView& in, const TensorView& residual, const TensorView& scratch,
                      std::span<std::byte> out, const kernels::CompressorConfig& codec,
                      const ExecContext& ctx) const = 0;
  // out = decode(payload), or out += decode(payload) when accumulating.
  virtual void decode(std::span<const std::byte> payload, const TensorView& out, bool accumulate,
                      const ExecContext& ctx) const = 0;

  // acc += x (f32, same numel).
  virtual void add(const TensorView& acc, const TensorView& x, const ExecContext& ctx) const = 0;
  // x /= divisor (divide) or x *= factor.
  virtual void scale(const TensorView& x, float factor, bool divide,
                     const ExecContext& ctx) const = 0;
  // The index of x's first Inf or NaN and its value, or -1.
  virtual int64_t first_non_finite(const TensorView& x, float* value,
                                   const ExecContext& ctx) const = 0;

  // A Work that completes once every one of `works` completed and then
  // `local` (if any) ran on the backend's data: a completion callback on the
  // host (when_all); stepped backends wait for them on the calling thread
  // (Work::wait, each bounded by that Work's timeout), run `local` there and
  // return a completed Work. Either way `local` does not run once one of
  // `works` failed, and the result fails with the first error in `works`
  // order, or with what `local` threw.
  virtual WorkPtr after(std::vector<WorkPtr> works, std::function<void()> local,
                        std::string what) const = 0;
};

// The backend of `device`: host kernels, or CUDA kernels on device.index.
// A build without CUDA gives a CUDA backend whose calls throw Unsupported.
std::unique_ptr<TensorBackend> tensor_backend(Device device);

// The entry check of a relaxed primitive that takes host tensors only:
// Unsupported naming the primitive, the rank and the device when `x` or the
// context is on a device. Nothing is read or written.
void require_host(const char* primitive, int rank, const TensorView& x, const ExecContext& ctx);

}  // namespace relaxcc::relaxed
