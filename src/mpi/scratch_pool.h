// Reusable scratch buffers for operations. Fresh large allocations cost page
// faults on every operation; the pool hands back buffers that earlier
// operations returned. Buffers are not zeroed. Thread-safe.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace relaxcc::mpi {

class ScratchPool : public std::enable_shared_from_this<ScratchPool> {
 public:
  class Buffer {
   public:
    Buffer() = default;
    Buffer(Buffer&&) noexcept = default;
    Buffer& operator=(Buffer&& other) noexcept {
      release();
      pool_ = std::move(other.pool_);
      data_ = std::move(other.data_);
      size_ = other.size_;
      return *this;
    }
    ~Buffer() { release(); }
    unsigned char* data() const noexcept { return data_.get(); }
    size_t size() const noexcept { return size_; }

   private:
    friend class ScratchPool;
    void release();
    std::shared_ptr<ScratchPool> pool_;
    std::unique_ptr<unsigned char[]> data_;
    size_t size_ = 0;
  };

  explicit ScratchPool(size_t max_cached_bytes) : max_cached_bytes_(max_cached_bytes) {}
  // A buffer of at least `bytes` (rounded up to a power of two).
  Buffer acquire(size_t bytes);

 private:
  void give_back(std::unique_ptr<unsigned char[]> data, size_t size);

  const size_t max_cached_bytes_;
  std::mutex mutex_;
  std::vector<std::pair<size_t, std::unique_ptr<unsigned char[]>>> free_;
  size_t cached_bytes_ = 0;
};

}  // namespace relaxcc::mpi
