#include "src/collectives/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "relaxcc/errors.h"

namespace relaxcc::engine {
namespace {

std::string object_name(uint32_t pid, uint32_t segment) {
  return detail::concat("/relaxcc.", pid, ".", segment);
}

}  // namespace

PeerMapping::~PeerMapping() {
  if (base != nullptr) munmap(const_cast<unsigned char*>(base), bytes);
}

class SharedMemory::Segment {
 public:
  Segment(std::shared_ptr<Registry> registry, std::string name, unsigned char* base, size_t bytes)
      : registry_(std::move(registry)), name_(std::move(name)), base_(base), bytes_(bytes) {}
  ~Segment() {
    {
      std::lock_guard<std::mutex> lock(registry_->mutex);
      registry_->segments.erase(base_);
    }
    munmap(base_, bytes_);
    shm_unlink(name_.c_str());
  }

 private:
  std::shared_ptr<Registry> registry_;
  std::string name_;
  unsigned char* base_;
  size_t bytes_;
};

SharedMemory::SharedMemory()
    : scratch_(std::make_shared<ScratchPool>(
          kScratchCacheBytes,
          [registry = registry_](size_t bytes) { return create(registry, bytes); })) {}

TensorView SharedMemory::allocate(int64_t numel, DType dtype) {
  auto [data, owner] =
      create(registry_, std::max<size_t>(static_cast<size_t>(numel) * dtype_size(dtype), 1));
  return TensorView(data, numel, dtype, Device::host(), std::move(owner));
}

ScratchPool::Storage SharedMemory::create(const std::shared_ptr<Registry>& registry, size_t bytes) {
  const auto pid = static_cast<uint32_t>(getpid());
  // Names are unique per process, not per communicator: every communicator
  // of this process creates its objects in the same namespace.
  static std::atomic<uint32_t> next_segment{1};
  const uint32_t segment = next_segment.fetch_add(1, std::memory_order_relaxed);
  const std::string name = object_name(pid, segment);
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 && errno == EEXIST) {  // left behind by a crashed process that had this pid
    shm_unlink(name.c_str());
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  }
  RELAXCC_ENFORCE(fd >= 0, CommunicationError, "allocate: shm_open(", name,
                  ") failed: ", std::strerror(errno));
  // posix_fallocate reserves the pages now, so a full /dev/shm is an error
  // here instead of a SIGBUS on first touch.
  const int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  void* base =
      rc == 0 ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  const int map_errno = errno;
  close(fd);
  if (base == MAP_FAILED) shm_unlink(name.c_str());
  RELAXCC_ENFORCE(rc == 0, CommunicationError, "allocate: cannot reserve ", bytes,
                  " bytes of shared memory (", name, "): ", std::strerror(rc));
  RELAXCC_ENFORCE(base != MAP_FAILED, CommunicationError, "allocate: mmap of ", bytes, " bytes (",
                  name, ") failed: ", std::strerror(map_errno));
  auto* data = static_cast<unsigned char*>(base);
  {
    std::lock_guard<std::mutex> lock(registry->mutex);
    registry->segments[data] = {bytes, segment};
  }
  return {data, std::make_shared<Segment>(registry, name, data, bytes)};
}

TensorView SharedMemory::acquire_scratch(size_t bytes) {
  auto buffer = std::make_shared<ScratchPool::Buffer>(scratch_->acquire(bytes));
  unsigned char* data = buffer->data();
  return TensorView(data, static_cast<int64_t>(bytes), DType::u8, Device::host(),
                    std::move(buffer));
}

std::optional<SharedRef> SharedMemory::find(const void* data, size_t bytes) const {
  const auto* p = static_cast<const unsigned char*>(data);
  std::lock_guard<std::mutex> lock(registry_->mutex);
  auto it = registry_->segments.upper_bound(p);
  if (it == registry_->segments.begin()) return std::nullopt;
  --it;
  const auto offset = static_cast<size_t>(p - it->first);
  if (offset + bytes > it->second.first) return std::nullopt;
  return SharedRef{static_cast<uint32_t>(getpid()), it->second.second, offset};
}

std::shared_ptr<const PeerMapping> SharedMemory::map_peer(const SharedRef& ref, size_t bytes,
                                                          int peer_rank) {
  const auto key = std::make_pair(ref.pid, ref.segment);
  std::shared_ptr<const PeerMapping> mapping;
  for (auto it = peers_.begin(); it != peers_.end(); ++it) {
    if (it->first != key) continue;
    mapping = it->second;
    peers_.erase(it);  // re-inserted at the back: most recently used
    break;
  }
  if (!mapping) {
    const std::string name = object_name(ref.pid, ref.segment);
    const int fd = shm_open(name.c_str(), O_RDONLY, 0);
    RELAXCC_ENFORCE(fd >= 0, CommunicationError, "rank ", peer_rank, "'s shared buffer ", name,
                    " cannot be opened: ", std::strerror(errno), " (is the rank on another node?)");
    struct stat st {};
    const int stat_rc = fstat(fd, &st);
    const size_t size = stat_rc == 0 ? static_cast<size_t>(st.st_size) : 0;
    void* base = size > 0 ? mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    const int map_errno = errno;
    close(fd);
    RELAXCC_ENFORCE(base != MAP_FAILED, CommunicationError, "rank ", peer_rank, "'s shared buffer ",
                    name, " cannot be mapped: ", std::strerror(map_errno));
    auto m = std::make_shared<PeerMapping>();
    m->base = static_cast<const unsigned char*>(base);
    m->bytes = size;
    mapping = std::move(m);
  }
  peers_.emplace_back(key, mapping);
  if (peers_.size() > kPeerCacheEntries) peers_.erase(peers_.begin());
  RELAXCC_ENFORCE(ref.offset <= mapping->bytes && bytes <= mapping->bytes - ref.offset,
                  PeerMismatch, "rank ", peer_rank, " names ", bytes, " bytes at offset ",
                  ref.offset, " of its shared buffer /relaxcc.", ref.pid, ".", ref.segment,
                  ", which holds ", mapping->bytes, " bytes");
  return mapping;
}

}  // namespace relaxcc::engine
