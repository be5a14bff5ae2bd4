#include "src/relaxed/compressed_shards.h"

#include <numeric>

#include "relaxcc/errors.h"

namespace relaxcc::relaxed {

void add_owner_schedule_traffic(std::vector<RelaxedStats::Traffic>& traffic, int me,
                                const std::vector<int64_t>& block, const std::vector<int64_t>& slot,
                                bool direct) {
  const int n = static_cast<int>(block.size());
  if (traffic.empty())
    for (int j = 0; j < n; ++j)
      if (j != me) traffic.push_back({j, 0, 0});
  const auto all = static_cast<uint64_t>(std::accumulate(slot.begin(), slot.end(), int64_t{0}));
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  for (RelaxedStats::Traffic& t : traffic) {
    const int j = t.peer;
    t.sent += static_cast<uint64_t>(block[j]);
    t.received += static_cast<uint64_t>(block[me]);
    if (direct) {
      t.sent += static_cast<uint64_t>(slot[me]);
      t.received += static_cast<uint64_t>(slot[j]);
      continue;
    }
    if (j == right) t.sent += all - static_cast<uint64_t>(slot[right]);
    if (j == left) t.received += all - static_cast<uint64_t>(slot[me]);
  }
}

WorkPtr spread_owner_slots(Communicator& comm, bool direct, const TensorView& own,
                           const TensorView& copies, const TensorView& gathered,
                           const std::vector<int64_t>& counts, const ExecContext& ctx,
                           const OpOptions& options) {
  if (direct) {
    AlltoallOptions a2a;
    static_cast<OpOptions&>(a2a) = options;
    const std::vector<int64_t> send_counts(static_cast<size_t>(comm.size()), own.numel);
    return comm.alltoallv(copies, send_counts, gathered, counts, ctx, a2a);
  }
  AllgatherOptions ag;
  static_cast<OpOptions&>(ag) = options;
  return comm.allgatherv(own, gathered, counts, ctx, ag);
}

WorkPtr counted_allreduce(Communicator& comm, const TensorView& x, const ExecContext& ctx,
                          AllreduceOptions options, RelaxedStats* stats,
                          const std::vector<int>& ranks) {
  const int n = comm.size(), me = comm.rank();
  RELAXCC_ENFORCE(ranks.empty() || static_cast<int>(ranks.size()) == n, InvalidArgument,
                  "counted allreduce on rank ", me, ": expected a peer name for each of the ", n,
                  " ranks, got ", ranks.size());
  if (!stats || n == 1) return comm.allreduce(x, ctx, options);
  options.algo = AllreduceAlgo::ring;
  WorkPtr done = comm.allreduce(x, ctx, options);
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  const int right_peer = ranks.empty() ? right : ranks[right];
  const int left_peer = ranks.empty() ? left : ranks[left];
  return when_all(
      {done},
      [stats, n, me, right, left, right_peer, left_peer, numel = x.numel,
       element = dtype_size(x.dtype)](Work&) {
        const Shards s(numel, n);
        const auto bytes = [&](int64_t v) { return static_cast<uint64_t>(v) * element; };
        const uint64_t sent = bytes(2 * numel - s.count[me] - s.count[right]);
        const uint64_t received = bytes(2 * numel - s.count[left] - s.count[me]);
        if (right == left) {
          stats->add_round({{right_peer, sent, received}});
        } else {
          stats->add_round({{right_peer, sent, 0}, {left_peer, 0, received}});
        }
      },
      "allreduce (counted)");
}

}  // namespace relaxcc::relaxed
