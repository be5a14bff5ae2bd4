#include "scratch_pool.h"

#include <bit>

namespace relaxcc::mpi {

void ScratchPool::Buffer::release() {
  if (pool_ && data_) pool_->give_back(std::move(data_), size_);
  pool_.reset();
}

ScratchPool::Buffer ScratchPool::acquire(size_t bytes) {
  Buffer b;
  b.size_ = std::bit_ceil(std::max<size_t>(bytes, 64));
  b.pool_ = shared_from_this();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->first == b.size_) {
        b.data_ = std::move(it->second);
        cached_bytes_ -= it->first;
        free_.erase(it);
        return b;
      }
    }
  }
  b.data_.reset(new unsigned char[b.size_]);
  return b;
}

void ScratchPool::give_back(std::unique_ptr<unsigned char[]> data, size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (cached_bytes_ + size > max_cached_bytes_) return;  // freed
  cached_bytes_ += size;
  free_.emplace_back(size, std::move(data));
}

}  // namespace relaxcc::mpi
