#include "src/relaxed/tensor_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cuda/cuda_kernels.h"
#include "relaxcc/errors.h"
#include "relaxcc/kernels/error_feedback.h"

namespace relaxcc::relaxed {

namespace {

constexpr size_t kHeaderBytes = sizeof(kernels::PayloadHeader);

// Host memory and the host kernels: what the schedules did before devices.
class HostBackend final : public TensorBackend {
 public:
  Device device() const noexcept override { return Device::host(); }
  bool stepped() const noexcept override { return false; }

  TensorView zeros(int64_t numel, DType dtype, const ExecContext&) const override {
    const size_t bytes = static_cast<size_t>(numel) * dtype_size(dtype);
    // Whole floats, so that f32 views are aligned.
    auto memory = std::make_shared<std::vector<float>>((bytes + sizeof(float) - 1) / sizeof(float));
    return TensorView(memory->data(), numel, dtype, Device::host(), memory);
  }
  TensorView payload_memory(Communicator& comm, int64_t bytes, const char*) const override {
    // A call's payloads (tens of MB for a large tensor) would be fresh
    // pages, faulted in and unmapped again on every call: the communicator
    // reuses them.
    return comm.host_scratch(bytes);
  }
  void check_communicator(Communicator&, const char*) const override {}

  void copy(void* dst, const void* src, size_t bytes, const ExecContext&) const override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  void fill(void* dst, unsigned char value, size_t bytes, const ExecContext&) const override {
    if (bytes > 0) std::memset(dst, value, bytes);
  }
  void finish(const ExecContext&) const override {}

  kernels::PayloadHeader read_header(std::span<const std::byte> payload,
                                     const ExecContext&) const override {
    return kernels::read_header(payload);
  }
  void encode(const TensorView& in, const TensorView& residual, const TensorView& scratch,
              std::span<std::byte> out, const kernels::CompressorConfig& codec,
              const ExecContext& ctx) const override {
    if (residual.numel == 0) {
      kernels::encode(in, out, codec, ctx);
      return;
    }
    const auto n = static_cast<size_t>(in.numel);
    kernels::compress_with_feedback(in, std::span(residual.as<float>(), n),
                                    std::span(scratch.as<float>(), n), out, codec, ctx);
  }
  void decode(std::span<const std::byte> payload, const TensorView& out, bool accumulate,
              const ExecContext& ctx) const override {
    if (accumulate)
      kernels::decode_accumulate(payload, out, ctx);
    else
      kernels::decode(payload, out, ctx);
  }

  void add(const TensorView& acc, const TensorView& x, const ExecContext&) const override {
    float* a = acc.as<float>();
    const float* v = x.as<const float>();
    for (int64_t k = 0; k < acc.numel; ++k) a[k] += v[k];
  }
  void scale(const TensorView& x, float factor, bool divide, const ExecContext&) const override {
    float* v = x.as<float>();
    if (divide) {
      for (int64_t k = 0; k < x.numel; ++k) v[k] /= factor;
    } else {
      for (int64_t k = 0; k < x.numel; ++k) v[k] *= factor;
    }
  }
  int64_t first_non_finite(const TensorView& x, float* value, const ExecContext&) const override {
    const auto* bytes = static_cast<const unsigned char*>(x.data);
    for (int64_t i = 0; i < x.numel; ++i) {
      float v;
      std::memcpy(&v, bytes + i * sizeof(float), sizeof v);
      if (!std::isfinite(v)) {
        *value = v;
        return i;
      }
    }
    return -1;
  }

  WorkPtr after(std::vector<WorkPtr> works, std::function<void()> local,
                std::string what) const override {
    return when_all(
        std::move(works),
        [local = std::move(local)](Work&) {
          if (local) local();
        },
        std::move(what));
  }
};

// Device memory of one CUDA device and the CUDA kernels, ordered on the
// context's stream. Every call makes the device current on its thread first.
class CudaBackend final : public TensorBackend {
 public:
  explicit CudaBackend(Device device) : device_(device) {}

  Device device() const noexcept override { return device_; }
  bool stepped() const noexcept override { return true; }

  TensorView zeros(int64_t numel, DType dtype, const ExecContext& ctx) const override {
    std::shared_ptr<void> memory = kernels::cuda::allocate(
        static_cast<size_t>(numel) * dtype_size(dtype), device_.index, ctx.stream);
    return TensorView(memory.get(), numel, dtype, device_, memory);
  }
  TensorView payload_memory(Communicator& comm, int64_t bytes, const char* what) const override {
    TensorView memory = comm.allocate(bytes, DType::u8);
    RELAXCC_ENFORCE(memory.device == device_, Unsupported, what, ": rank ", comm.rank(),
                    "'s communicator allocates its buffers on ", memory.device,
                    ", the tensor is on ", device_,
                    ": device tensors need a communicator that moves device memory (an NCCL "
                    "communicator, relaxcc/nccl_communicator.h)");
    return memory;
  }
  void check_communicator(Communicator& comm, const char* what) const override {
    payload_memory(comm, 0, what);
  }

  void copy(void* dst, const void* src, size_t bytes, const ExecContext& ctx) const override {
    kernels::cuda::set_device(device_.index);
    kernels::cuda::copy_async(dst, src, bytes, ctx.stream);
  }
  void fill(void* dst, unsigned char value, size_t bytes, const ExecContext& ctx) const override {
    kernels::cuda::set_device(device_.index);
    kernels::cuda::fill_async(dst, value, bytes, ctx.stream);
  }
  void finish(const ExecContext& ctx) const override {
    kernels::cuda::set_device(device_.index);
    kernels::cuda::synchronize(ctx.stream);
  }

  kernels::PayloadHeader read_header(std::span<const std::byte> payload,
                                     const ExecContext& ctx) const override {
    RELAXCC_ENFORCE_GE(payload.size(), kHeaderBytes, CorruptPayload,
                       "payload shorter than its header");
    kernels::PayloadHeader h;
    copy(&h, payload.data(), kHeaderBytes, ctx);
    finish(ctx);
    kernels::validate_header(h, payload.size());
    return h;
  }
  void encode(const TensorView& in, const TensorView& residual, const TensorView& scratch,
              std::span<std::byte> out, const kernels::CompressorConfig& codec,
              const ExecContext& ctx) const override {
    kernels::cuda::set_device(device_.index);
    if (residual.numel == 0) {
      kernels::encode(in, out, codec, ctx);
      return;
    }
    // e = x + residual in scratch; payload = encode(e); residual = e -
    // decode(payload). An input the codec refuses leaves the residual as it was.
    kernels::cuda::sum(scratch.as<float>(), in.as<const float>(), residual.as<const float>(),
                       in.numel, ctx.stream);
    const size_t bytes = kernels::encode(scratch, out, codec, ctx);
    kernels::decode(out.first(bytes), residual, ctx);
    kernels::cuda::subtract_from(residual.as<float>(), scratch.as<const float>(), in.numel,
                                 ctx.stream);
  }
  void decode(std::span<const std::byte> payload, const TensorView& out, bool accumulate,
              const ExecContext& ctx) const override {
    kernels::cuda::set_device(device_.index);
    if (accumulate)
      kernels::decode_accumulate(payload, out, ctx);
    else
      kernels::decode(payload, out, ctx);
  }

  void add(const TensorView& acc, const TensorView& x, const ExecContext& ctx) const override {
    kernels::cuda::set_device(device_.index);
    kernels::cuda::add(acc.as<float>(), x.as<const float>(), acc.numel, ctx.stream);
  }
  void scale(const TensorView& x, float factor, bool divide,
             const ExecContext& ctx) const override {
    kernels::cuda::set_device(device_.index);
    kernels::cuda::scale(x.as<float>(), x.numel, factor, divide, ctx.stream);
  }
  int64_t first_non_finite(const TensorView& x, float* value,
                           const ExecContext& ctx) const override {
    kernels::cuda::set_device(device_.index);
    const int64_t i = kernels::cuda::first_non_finite(x.as<const float>(), x.numel, ctx.stream);
    if (i >= 0) {
      copy(value, x.as<const float>() + i, sizeof(float), ctx);
      finish(ctx);
    }
    return i;
  }

  WorkPtr after(std::vector<WorkPtr> works, std::function<void()> local,
                std::string what) const override {
    auto done = std::make_shared<Work>(std::move(what));
    try {
      for (const WorkPtr& w : works)
        if (w) w->wait();
      if (local) local();
      done->complete(nullptr);
    } catch (...) {
      done->complete(std::current_exception());
    }
    return done;
  }

 private:
  Device device_;
};

}  // namespace

std::unique_ptr<TensorBackend> tensor_backend(Device device) {
  if (device.is_cuda()) return std::make_unique<CudaBackend>(device);
  return std::make_unique<HostBackend>();
}

void require_host(const char* primitive, int rank, const TensorView& x, const ExecContext& ctx) {
  RELAXCC_ENFORCE(x.device.is_host() && ctx.device.is_host(), Unsupported, primitive, ": rank ",
                  rank, " was given a tensor on ", x.device, " with a context on ", ctx.device,
                  "; ", primitive,
                  " takes host tensors only (on devices: compressed_allreduce, with or without its "
                  "auto codec)");
}

}  // namespace relaxcc::relaxed
