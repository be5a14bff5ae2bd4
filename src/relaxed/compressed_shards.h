// What the compressed allreduce (compressed_allreduce.cc), its auto codec
// (auto_codec.cc) and the sparse allreduce (sparse_allreduce.cc) share:
// which codecs are dense, the shards of a tensor, byte views of buffers, and
// a full-precision allreduce whose bytes are counted per peer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "relaxcc/collectives/shares.h"
#include "relaxcc/communicator.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/relaxed/relaxed_stats.h"
#include "src/collectives/ring_schedule.h"

namespace relaxcc::relaxed {

inline bool dense(kernels::CompressorKind kind) {
  return kind == kernels::CompressorKind::f16 || kind == kernels::CompressorKind::bf16 ||
         kind == kernels::CompressorKind::minmax || kind == kernels::CompressorKind::sign;
}

// The shards: the ring's balanced chunks, or split by `shares`
// (relaxcc/collectives/shares.h), and where each starts.
struct Shards {
  std::vector<int64_t> count, offset;
  Shards(int64_t numel, int n, const std::vector<double>& shares = {})
      : count(shard_counts(numel, n, shares)), offset(count.size(), 0) {
    for (size_t j = 1; j < count.size(); ++j) offset[j] = offset[j - 1] + count[j - 1];
  }
};

// Bytes [offset, offset + n) of a host buffer, as a codec reads or writes them.
inline std::span<std::byte> bytes_of(std::vector<unsigned char>& v, int64_t offset, int64_t n) {
  return std::as_writable_bytes(std::span(v.data() + offset, static_cast<size_t>(n)));
}

// Adds the bytes per peer of an owner schedule to `traffic` (one entry per
// peer but `me`, in rank order): an alltoallv that sends each peer j
// `block[j]` bytes and receives `block[me]` from it, then the owners' slots
// of `slot[j]` bytes to every rank: by an allgatherv ring, which sends the
// right neighbour every slot but its own and receives from the left
// neighbour every slot but this rank's, or (direct) by an alltoallv that
// sends every peer this rank's slot and receives each peer's from it. The
// compressed allreduce calls it per segment, the sparse one once.
void add_owner_schedule_traffic(std::vector<RelaxedStats::Traffic>& traffic, int me,
                                const std::vector<int64_t>& block, const std::vector<int64_t>& slot,
                                bool direct = false);

// Step 4 of an owner schedule: every owner's slot (`own` on this rank, owner
// j's of `counts[j]` bytes at its place in `gathered`) to every rank,
// unchanged. Direct: an alltoallv from `copies`, which holds size() copies of
// `own` (written by the caller before `options`' dependencies complete);
// otherwise an allgatherv ring of `own`.
WorkPtr spread_owner_slots(Communicator& comm, bool direct, const TensorView& own,
                           const TensorView& copies, const TensorView& gathered,
                           const std::vector<int64_t>& counts, const ExecContext& ctx,
                           const OpOptions& options);

// comm.allreduce(x, ctx, options), with its bytes per peer added to `stats`
// (if set) when it completes. Counting runs it on the ring (options.algo
// forced; the other algorithms move other bytes): the reduce-scatter sends
// the right neighbour every chunk but this rank's, the allgather every
// chunk but the right neighbour's. `ranks`, when not empty, names the peer
// in `stats` of each rank of `comm` (a group's members in its parent: one
// per rank of comm); empty: comm's own ranks.
WorkPtr counted_allreduce(Communicator& comm, const TensorView& x, const ExecContext& ctx,
                          AllreduceOptions options, RelaxedStats* stats,
                          const std::vector<int>& ranks = {});

}  // namespace relaxcc::relaxed
