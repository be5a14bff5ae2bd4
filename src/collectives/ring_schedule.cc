#include "src/collectives/ring_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace relaxcc {

std::vector<int64_t> balanced_chunks(int64_t numel, int size) {
  std::vector<int64_t> counts(static_cast<size_t>(size), numel / size);
  for (int c = 0; c < numel % size; ++c) ++counts[c];
  return counts;
}

int path_window(double bits_per_s, double round_trip_s, int64_t segment_bytes, int min_depth,
                int64_t max_bytes) {
  const int64_t segment = std::max<int64_t>(segment_bytes, 1);
  const int64_t most = std::max<int64_t>(min_depth, std::max<int64_t>(max_bytes, 0) / segment);
  const double bdp_segments = bits_per_s / 8 * round_trip_s / static_cast<double>(segment);
  // Also false for NaN.
  if (!(bdp_segments > 0)) return min_depth;
  const double wanted = std::ceil(std::min(bdp_segments, static_cast<double>(INT32_MAX)));
  return static_cast<int>(
      std::min<int64_t>({std::max<int64_t>(min_depth, static_cast<int64_t>(wanted)), most,
                         static_cast<int64_t>(INT32_MAX)}));
}

RingSchedule::RingSchedule(int rank, int size, const std::vector<int64_t>& chunk_counts,
                           int64_t requested_segment_elems, int pipeline_depth, bool reduce_phase,
                           bool gather_phase)
    : segment_elems(std::max<int64_t>(1, requested_segment_elems)) {
  chunk_offset.resize(chunk_counts.size());
  int64_t total = 0;
  for (size_t c = 0; c < chunk_counts.size(); ++c) {
    chunk_offset[c] = total;
    total += chunk_counts[c];
  }
  const int n = size, r = rank;
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  // Index of the first incoming message of each (phase, step).
  std::vector<int64_t> in_start_rs(n, 0), in_start_ag(n, 0), out_start_rs(n, 0);
  auto add_chunk = [&](std::vector<RingSegment>& list, bool reduce, int step, int chunk) {
    const int64_t count = chunk_counts[chunk];
    for (int64_t off = 0, seg = 0; off < count; off += segment_elems, ++seg)
      list.push_back(RingSegment{reduce, step, chunk, chunk_offset[chunk] + off,
                                 std::min(segment_elems, count - off), seg, -1, -1});
    max_segments = std::max(max_segments, (count + segment_elems - 1) / segment_elems);
  };
  if (reduce_phase) {
    for (int s = 0; s < n - 1; ++s) {
      in_start_rs[s] = static_cast<int64_t>(in.size());
      add_chunk(in, true, s, mod(r - s - 2));
    }
  }
  if (gather_phase) {
    for (int s = 0; s < n - 1; ++s) {
      in_start_ag[s] = static_cast<int64_t>(in.size());
      add_chunk(in, false, s, mod(r - s - 1));
    }
  }
  if (reduce_phase) {
    for (int s = 0; s < n - 1; ++s) {
      const size_t first = out.size();
      out_start_rs[s] = static_cast<int64_t>(first);
      add_chunk(out, true, s, mod(r - s - 1));
      if (s > 0)
        for (size_t k = first; k < out.size(); ++k)
          out[k].dep = in_start_rs[s - 1] + static_cast<int64_t>(k - first);
    }
    // Segment j of step s reuses the buffer half of step s-2, forwarded by
    // the send of step s-1.
    // (Segment j of step s-2 exists only if its chunk has that many segments.)
    std::vector<int64_t> in_segments(n, 0);
    for (const RingSegment& m : in)
      if (m.reduce) ++in_segments[m.step];
    last_slots = std::min<int64_t>(std::max(1, pipeline_depth), in_segments[n - 2]);
    for (int64_t k = 0; k < static_cast<int64_t>(in.size()); ++k) {
      RingSegment& m = in[k];
      if (!m.reduce) continue;
      if (m.step == n - 2) {
        if (m.seg >= last_slots) m.reuse_in = k - last_slots;
      } else if (m.step >= 2 && m.seg < in_segments[m.step - 2]) {
        m.reuse = out_start_rs[m.step - 1] + m.seg;
      }
    }
  }
  if (gather_phase) {
    for (int s = 0; s < n - 1; ++s) {
      const size_t first = out.size();
      add_chunk(out, false, s, mod(r - s));
      for (size_t k = first; k < out.size(); ++k) {
        const auto seg = static_cast<int64_t>(k - first);
        if (s > 0)
          out[k].dep = in_start_ag[s - 1] + seg;
        else if (reduce_phase)
          out[k].dep = in_start_rs[n - 2] + seg;
      }
    }
  }
}

int64_t RingSchedule::slot(const RingSegment& m, int size) const {
  return m.step == size - 2 ? m.seg % last_slots : last_slots + (m.step % 2) * max_segments + m.seg;
}

int64_t RingSchedule::slots(int size) const {
  return last_slots + std::min(2, size - 2) * max_segments;  // the halves: steps before the last
}

}  // namespace relaxcc
