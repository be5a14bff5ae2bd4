#include "src/collectives/scratch_pool.h"

#include <algorithm>
#include <bit>

namespace relaxcc {

void ScratchPool::Buffer::release() {
  if (pool_ && storage_.first != nullptr) pool_->give_back(std::move(storage_), size_);
  storage_ = {nullptr, nullptr};
  pool_.reset();
}

ScratchPool::ScratchPool(size_t max_cached_bytes, Allocate allocate)
    : max_cached_bytes_(max_cached_bytes), allocate_(std::move(allocate)) {}

ScratchPool::Storage ScratchPool::heap(size_t bytes) {
  std::shared_ptr<unsigned char[]> memory(new unsigned char[bytes]);
  return {memory.get(), std::move(memory)};
}

ScratchPool::Buffer ScratchPool::acquire(size_t bytes) {
  Buffer b;
  b.size_ = std::bit_ceil(std::max<size_t>(bytes, 64));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->first == b.size_) {
        b.storage_ = std::move(it->second);
        cached_bytes_ -= it->first;
        free_.erase(it);
        b.pool_ = shared_from_this();
        return b;
      }
    }
  }
  b.storage_ = allocate_(b.size_);
  b.pool_ = shared_from_this();
  return b;
}

void ScratchPool::give_back(Storage storage, size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (cached_bytes_ + size > max_cached_bytes_) return;  // freed
  cached_bytes_ += size;
  free_.emplace_back(size, std::move(storage));
}

}  // namespace relaxcc
