// Node-shared memory for collective buffers.
//
// Communicator::allocate() on a communicator whose ranks share one node
// returns memory from here: a POSIX shared-memory object per allocation,
// named after the owner's pid and a per-process counter, mapped read-write
// by the owner. A peer on the same node that is told (pid, segment, offset)
// in an operation header maps the object read-only and reads the data in
// place, so the ring reduces straight from its neighbour's buffer instead of
// copying it through MPI.
//
// Lifetime: the owner unlinks the name and unmaps when the last TensorView
// owner is released. Peers keep their mapping (the memory lives on until
// every mapping is gone) in a small cache per communicator. A segment's name
// exists while an operation that names it is in flight, because the owner's
// Work holds the view's owner until its peers said they finished reading.
// A process that crashes leaves its objects in /dev/shm (as MPI's
// shared-memory transport does).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "relaxcc/tensor.h"
#include "src/collectives/scratch_pool.h"

namespace relaxcc::engine {

// Where a buffer lies in a shared-memory object.
struct SharedRef {
  uint32_t pid = 0;      // owner process; 0 means "not shared"
  uint32_t segment = 0;  // owner's allocation counter
  uint64_t offset = 0;   // bytes from the start of the object
};

// A peer's object mapped read-only.
struct PeerMapping {
  const unsigned char* base = nullptr;
  size_t bytes = 0;
  ~PeerMapping();
};

class SharedMemory {
 public:
  SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  // A view of `numel` (>= 0) zeroed elements in a new shared object; its owner
  // unmaps and unlinks it. Throws CommunicationError when the system cannot
  // provide the memory (for example a full /dev/shm).
  TensorView allocate(int64_t numel, DType dtype);

  // Scratch of at least `bytes` bytes for an operation's partial results
  // that peers read, from a ScratchPool of shared objects: one an earlier
  // operation released (so pages and peers' mappings are reused) or a new
  // one. It returns to the pool when the view's owner is released. Throws as
  // allocate() does.
  TensorView acquire_scratch(size_t bytes);

  // The object holding [data, data + bytes), if allocate() made it.
  std::optional<SharedRef> find(const void* data, size_t bytes) const;

  // Maps a peer's object (cached). Throws CommunicationError when it cannot
  // be opened or is smaller than offset + bytes.
  std::shared_ptr<const PeerMapping> map_peer(const SharedRef& ref, size_t bytes, int peer_rank);

 private:
  // This process's live objects, shared with their owners (which may
  // outlive the communicator).
  struct Registry {
    std::mutex mutex;
    std::map<const unsigned char*, std::pair<size_t, uint32_t>>
        segments;  // base -> (bytes, segment)
  };
  class Segment;

  // A new object of `bytes` (> 0) bytes, registered in `registry`.
  static ScratchPool::Storage create(const std::shared_ptr<Registry>& registry, size_t bytes);

  // Released scratch objects kept for reuse, at most this many bytes.
  static constexpr size_t kScratchCacheBytes = size_t{256} << 20;

  std::shared_ptr<Registry> registry_ = std::make_shared<Registry>();
  std::shared_ptr<ScratchPool> scratch_;
  // Engine thread only.
  static constexpr size_t kPeerCacheEntries = 64;
  std::vector<std::pair<std::pair<uint32_t, uint32_t>, std::shared_ptr<const PeerMapping>>> peers_;
};

}  // namespace relaxcc::engine
