#include "relaxcc/relaxed/relaxed_stats.h"

#include <algorithm>

namespace relaxcc {

namespace {
void add_to(std::vector<uint64_t>& per_peer, int peer, uint64_t n) {
  if (per_peer.size() <= static_cast<size_t>(peer))
    per_peer.resize(static_cast<size_t>(peer) + 1, 0);
  per_peer[static_cast<size_t>(peer)] += n;
}
void add_to(std::vector<uint64_t>& per_peer, uint64_t& total, int peer, uint64_t n) {
  add_to(per_peer, peer, n);
  total += n;
}
}  // namespace

void RelaxedStats::add_round(const std::vector<int>& to, uint64_t sent,
                             const std::vector<int>& from, uint64_t received,
                             const std::vector<int>& missing, const std::vector<int>& left_out_by) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int p : to) add_to(counts_.sent_to, counts_.bytes_sent, p, sent);
  for (int p : from) add_to(counts_.received_from, counts_.bytes_received, p, received);
  for (int p : missing) add_to(counts_.missed_from, counts_.missed, p, 1);
  for (int p : left_out_by) add_to(counts_.left_out_by, p, 1);
  ++counts_.rounds;
  counts_.partial_rounds += missing.empty() ? 0 : 1;
}

void RelaxedStats::add_round(const std::vector<Traffic>& traffic) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Traffic& t : traffic) {
    if (t.sent > 0) add_to(counts_.sent_to, counts_.bytes_sent, t.peer, t.sent);
    if (t.received > 0) add_to(counts_.received_from, counts_.bytes_received, t.peer, t.received);
  }
  ++counts_.rounds;
}

}  // namespace relaxcc
