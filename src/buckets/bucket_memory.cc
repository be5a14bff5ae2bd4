#include "src/buckets/bucket_memory.h"

#include <cstring>

#include "kernels/cuda/cuda_kernels.h"
#include "relaxcc/errors.h"

namespace relaxcc::buckets {

namespace {

// Host memory, copied on the calling thread.
class HostBucketMemory final : public BucketMemory {
 public:
  explicit HostBucketMemory(const ExecContext& exec) : exec_(exec) {}

  Device device() const noexcept override { return Device::host(); }
  ExecContext bucket_context() const override { return exec_; }
  TensorView allocate(int64_t bytes) override {
    auto memory = std::make_shared<std::vector<unsigned char>>(static_cast<size_t>(bytes));
    return TensorView(memory->data(), bytes, DType::u8, Device::host(), memory);
  }
  void record_ready(int) override {}
  void await_ready(int) override {}
  void acquire() override {}
  void copy_in(int, void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void zero(void* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
  std::vector<unsigned char> read(const void* src, size_t bytes) override {
    const auto* p = static_cast<const unsigned char*>(src);
    return std::vector<unsigned char>(p, p + bytes);
  }
  void write(void* dst, const std::vector<unsigned char>& bytes) override {
    if (!bytes.empty()) std::memcpy(dst, bytes.data(), bytes.size());
  }
  void publish() override {}
  void finish() override {}

 private:
  ExecContext exec_;
};

// Makes `device` current for its lifetime, then the thread's own device again.
class OnDevice {
 public:
  explicit OnDevice(int device) : device_(device), previous_(kernels::cuda::get_device()) {
    if (previous_ != device_) kernels::cuda::set_device(device_);
  }
  ~OnDevice() {
    if (previous_ == device_) return;
    try {
      kernels::cuda::set_device(previous_);
    } catch (...) {
    }
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int device_;
  int previous_;
};

// Device memory of one CUDA device; copies on a stream of its own, ordered
// after the producer stream by events (see bucket_memory.h).
class CudaBucketMemory final : public BucketMemory {
 public:
  CudaBucketMemory(const ExecContext& exec, Device device, size_t tensors)
      : device_(device), producer_(exec.stream) {
    OnDevice on(device_.index);
    stream_ = kernels::cuda::create_stream(device_.index);
    published_ = kernels::cuda::create_event(device_.index);
    acquired_ = kernels::cuda::create_event(device_.index);
    ready_.reserve(tensors);
    for (size_t i = 0; i < tensors; ++i)
      ready_.push_back(kernels::cuda::create_event(device_.index));
  }
  ~CudaBucketMemory() override {
    // Nothing enqueued may outlive the stream and the events.
    try {
      finish();
    } catch (...) {
    }
  }

  Device device() const noexcept override { return device_; }
  ExecContext bucket_context() const override {
    ExecContext ctx;
    ctx.device = device_;
    ctx.stream = stream_.get();
    return ctx;
  }
  TensorView allocate(int64_t bytes) override {
    OnDevice on(device_.index);
    std::shared_ptr<void> memory =
        kernels::cuda::allocate(static_cast<size_t>(bytes), device_.index, stream_.get());
    finish();  // zeroed for every stream
    return TensorView(memory.get(), bytes, DType::u8, device_, memory);
  }
  void record_ready(int index) override {
    OnDevice on(device_.index);
    kernels::cuda::record_event(event(index), producer_);
  }
  void await_ready(int index) override {
    OnDevice on(device_.index);
    kernels::cuda::wait_event(stream_.get(), event(index));
  }
  void acquire() override {
    OnDevice on(device_.index);
    kernels::cuda::record_event(acquired_.get(), producer_);
    kernels::cuda::wait_event(stream_.get(), acquired_.get());
  }
  void copy_in(int index, void* dst, const void* src, size_t bytes) override {
    OnDevice on(device_.index);
    kernels::cuda::wait_event(stream_.get(), event(index));
    kernels::cuda::copy_async(dst, src, bytes, stream_.get());
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    OnDevice on(device_.index);
    kernels::cuda::copy_async(dst, src, bytes, stream_.get());
  }
  void zero(void* dst, size_t bytes) override {
    OnDevice on(device_.index);
    kernels::cuda::fill_async(dst, 0, bytes, stream_.get());
  }
  std::vector<unsigned char> read(const void* src, size_t bytes) override {
    std::vector<unsigned char> out(bytes);
    OnDevice on(device_.index);
    kernels::cuda::copy_async(out.data(), src, bytes, stream_.get());
    kernels::cuda::synchronize(stream_.get());
    return out;
  }
  void write(void* dst, const std::vector<unsigned char>& bytes) override {
    OnDevice on(device_.index);
    kernels::cuda::copy_async(dst, bytes.data(), bytes.size(), stream_.get());
    kernels::cuda::synchronize(stream_.get());
  }
  void publish() override {
    OnDevice on(device_.index);
    kernels::cuda::record_event(published_.get(), stream_.get());
    kernels::cuda::wait_event(producer_, published_.get());
  }
  void finish() override {
    OnDevice on(device_.index);
    kernels::cuda::synchronize(stream_.get());
  }

 private:
  void* event(int index) const {
    RELAXCC_ENFORCE(index >= 0 && static_cast<size_t>(index) < ready_.size(), InternalError,
                    "bucket memory: readiness event of unknown tensor #", index);
    return ready_[static_cast<size_t>(index)].get();
  }

  Device device_;
  void* producer_;  // cudaStream_t where gradients are computed (not owned)
  std::shared_ptr<void> stream_;
  std::shared_ptr<void> published_, acquired_;
  std::vector<std::shared_ptr<void>> ready_;  // one per tensor
};

}  // namespace

std::unique_ptr<BucketMemory> bucket_memory(const ExecContext& exec, Device device,
                                            size_t tensors) {
  if (device.is_cuda()) return std::make_unique<CudaBucketMemory>(exec, device, tensors);
  return std::make_unique<HostBucketMemory>(exec);
}

}  // namespace relaxcc::buckets
