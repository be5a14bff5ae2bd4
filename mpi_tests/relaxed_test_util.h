// Helpers shared by the tests of the relaxed primitives: checks that every
// rank holds the same bits, and that the per-peer byte counts of two ends
// agree. Each is a collective (an allgather): every rank calls it.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "relaxcc/communicator.h"
#include "relaxcc/relaxed/relaxed_stats.h"

namespace relaxcc::test {

// The first rank whose x differs from this rank's in any bit; -1: none.
inline int rank_that_differs(Communicator& comm, const std::vector<float>& x) {
  const auto count = static_cast<int64_t>(x.size());
  const int n = comm.size();
  std::vector<float> mine = x, all(static_cast<size_t>(count * n));
  comm.allgather(TensorView::host(mine.data(), count), TensorView::host(all.data(), count * n),
                 ExecContext::host())
      ->wait();
  for (int r = 0; r < n; ++r)
    if (std::memcmp(all.data() + r * count, x.data(), x.size() * sizeof(float)) != 0) return r;
  return -1;
}

// The first pair whose ends disagree, "rank i sent rank j a bytes, j counted
// b from i"; empty when what every rank counted as sent to each peer is what
// that peer counted as received from it.
inline std::string counts_that_disagree(Communicator& comm, const RelaxedCounts& c) {
  const int n = comm.size();
  const auto at = [](const std::vector<uint64_t>& v, int j) {
    return j < static_cast<int>(v.size()) ? static_cast<int64_t>(v[j]) : int64_t{0};
  };
  std::vector<int64_t> mine(2 * static_cast<size_t>(n)), all(2 * static_cast<size_t>(n * n));
  for (int j = 0; j < n; ++j) {
    mine[2 * j] = at(c.sent_to, j);
    mine[2 * j + 1] = at(c.received_from, j);
  }
  comm.allgather(TensorView::host(mine.data(), 2 * n), TensorView::host(all.data(), 2 * n * n),
                 ExecContext::host())
      ->wait();
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      const int64_t sent = all[2 * (i * n + j)], received = all[2 * (j * n + i) + 1];
      if (sent != received)
        return "rank " + std::to_string(i) + " sent rank " + std::to_string(j) + " " +
               std::to_string(sent) + " bytes, rank " + std::to_string(j) + " counted " +
               std::to_string(received) + " from it";
    }
  return {};
}

}  // namespace relaxcc::test
