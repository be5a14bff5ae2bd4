#include "relaxcc/relaxed/relaxed_stats.h"

#include <algorithm>

namespace relaxcc {

void RelaxedStats::add_round(const std::vector<int>& to, uint64_t sent,
                             const std::vector<int>& from, uint64_t received, uint64_t missed) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto grow = [](std::vector<uint64_t>& v, int peer) {
    if (v.size() <= static_cast<size_t>(peer)) v.resize(static_cast<size_t>(peer) + 1, 0);
  };
  for (int p : to) {
    grow(counts_.sent_to, p);
    counts_.sent_to[p] += sent;
    counts_.bytes_sent += sent;
  }
  for (int p : from) {
    grow(counts_.received_from, p);
    counts_.received_from[p] += received;
    counts_.bytes_received += received;
  }
  ++counts_.rounds;
  counts_.partial_rounds += missed > 0 ? 1 : 0;
  counts_.missed += missed;
}

}  // namespace relaxcc
