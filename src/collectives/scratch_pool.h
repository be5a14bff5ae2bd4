// Reusable scratch buffers for operations. Fresh large allocations cost page
// faults on every operation (and, for node-shared memory, a new object that
// peers map again); the pool hands back buffers that earlier operations
// returned. Sizes are rounded up to a power of two. Buffers are not zeroed.
// Thread-safe.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace relaxcc {

class ScratchPool : public std::enable_shared_from_this<ScratchPool> {
 public:
  // Storage of `bytes`: its start, and the owner whose release frees it.
  using Storage = std::pair<unsigned char*, std::shared_ptr<const void>>;
  using Allocate = std::function<Storage(size_t bytes)>;

  class Buffer {
   public:
    Buffer() = default;
    Buffer(Buffer&&) noexcept = default;
    Buffer& operator=(Buffer&& other) noexcept {
      release();
      pool_ = std::move(other.pool_);
      storage_ = std::move(other.storage_);
      size_ = other.size_;
      return *this;
    }
    ~Buffer() { release(); }
    unsigned char* data() const noexcept { return storage_.first; }
    size_t size() const noexcept { return size_; }

   private:
    friend class ScratchPool;
    void release();
    std::shared_ptr<ScratchPool> pool_;
    Storage storage_{nullptr, nullptr};
    size_t size_ = 0;
  };

  // Keeps at most `max_cached_bytes` of returned buffers; `allocate` makes
  // new storage (default: the heap).
  explicit ScratchPool(size_t max_cached_bytes, Allocate allocate = heap);
  // A buffer of at least `bytes` (rounded up to a power of two). Throws what
  // `allocate` throws.
  Buffer acquire(size_t bytes);

 private:
  static Storage heap(size_t bytes);
  void give_back(Storage storage, size_t size);

  const size_t max_cached_bytes_;
  const Allocate allocate_;
  std::mutex mutex_;
  std::vector<std::pair<size_t, Storage>> free_;
  size_t cached_bytes_ = 0;
};

}  // namespace relaxcc
