// The pipelined ring's schedule for one rank of `size` (ranks of a
// communicator or group, in ring order r -> r+1): the segments it receives
// from r-1 and sends to r+1, in order, and what each waits for.
// Transport-neutral: src/protocols/ring.h runs it over MPI messages or node-shared
// memory; a compressed mode only changes what a segment carries.
//
// The tensor is split into size chunks (chunk c belongs to rank c) and each
// chunk into segments of at most segment_elems. Reduce-scatter step s sends
// chunk (r-s-1) and receives chunk (r-s-2), which it combines with its own
// contribution; after size-1 steps rank r holds the reduction of chunk r.
// Allgather step s sends chunk (r-s) and receives chunk (r-s-1). An outgoing
// segment forwards an incoming one (dep): it goes once that one is absorbed.
//
// Reduce-scatter segments land in scratch slots (slot()). Segments of the
// last step are combined straight into the result, so their slot is free
// once combined: they cycle through pipeline_depth slots (reuse_in).
// Segments of earlier steps wait in a double buffer of two chunks, by step
// parity, until forwarded: segment j of step s may land only once the send
// that forwarded segment j of step s-2 (same half) completed (reuse). This
// cannot deadlock: every wait points to an earlier step.
#pragma once

#include <cstdint>
#include <vector>

namespace relaxcc {

// The ring's chunks of a tensor of `numel` elements over `size` ranks: the
// first numel % size chunks hold one element more.
std::vector<int64_t> balanced_chunks(int64_t numel, int size);

// The in-flight window of a pipelined ring or chain when it is not set
// (RELAXCC_PIPELINE_DEPTH 0), and the least one sized to a path.
constexpr int kMinPipelineDepth = 4;

// The in-flight window, in segments of `segment_bytes`, that keeps a link of
// `bits_per_s` busy over a round trip of `round_trip_s`: the bandwidth-delay
// product in segments, rounded up, at least `min_depth`, and at most
// max(min_depth, max_bytes / segment_bytes) (and INT32_MAX). A rate or round
// trip that is not positive (or not finite) gives `min_depth`.
int path_window(double bits_per_s, double round_trip_s, int64_t segment_bytes, int min_depth,
                int64_t max_bytes);

struct RingSegment {
  bool reduce = false;  // reduce-scatter phase (else allgather)
  int step = 0;
  int chunk = 0;
  int64_t offset = 0;  // element offset in the full layout
  int64_t count = 0;
  int64_t seg = 0;        // segment index within the chunk
  int64_t dep = -1;       // outgoing: the incoming segment it forwards
  int64_t reuse = -1;     // incoming reduce-scatter: the outgoing segment that must
                          // complete before this one may land in its buffer half
  int64_t reuse_in = -1;  // incoming last-step segment: the incoming segment that
                          // must be absorbed before this one takes its slot
};

struct RingSchedule {
  RingSchedule(int rank, int size, const std::vector<int64_t>& chunk_counts, int64_t segment_elems,
               int pipeline_depth, bool reduce_phase, bool gather_phase);

  // The scratch slot (of slots()) where incoming reduce-scatter segment `m` lands.
  int64_t slot(const RingSegment& m, int size) const;
  int64_t slots(int size) const;

  int64_t segment_elems = 1;
  std::vector<int64_t> chunk_offset;  // element offset of each chunk
  std::vector<RingSegment> in, out;   // in schedule order
  int64_t max_segments = 0;           // segments of the largest chunk
  int64_t last_slots = 0;             // slots of the last reduce-scatter step
};

}  // namespace relaxcc
