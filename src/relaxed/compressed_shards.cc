#include "compressed_shards.h"

namespace relaxcc::relaxed {

WorkPtr counted_allreduce(Communicator& comm, const TensorView& x, const ExecContext& ctx,
                          AllreduceOptions options, RelaxedStats* stats) {
  const int n = comm.size(), me = comm.rank();
  if (!stats || n == 1) return comm.allreduce(x, ctx, options);
  options.algo = AllreduceAlgo::ring;
  WorkPtr done = comm.allreduce(x, ctx, options);
  return when_all(
      {done},
      [stats, n, me, numel = x.numel, element = dtype_size(x.dtype)](Work&) {
        const Shards s(numel, n);
        const int right = (me + 1) % n, left = (me + n - 1) % n;
        const auto bytes = [&](int64_t v) { return static_cast<uint64_t>(v) * element; };
        const uint64_t sent = bytes(2 * numel - s.count[me] - s.count[right]);
        const uint64_t received = bytes(2 * numel - s.count[left] - s.count[me]);
        if (right == left) {
          stats->add_round({{right, sent, received}});
        } else {
          stats->add_round({{right, sent, 0}, {left, 0, received}});
        }
      },
      "allreduce (counted)");
}

}  // namespace relaxcc::relaxed
