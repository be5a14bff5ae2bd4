#include "relaxcc/relaxed/group_average.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "src/relaxed/compressed_shards.h"
#include "src/relaxed/peer_mixing.h"
#include "src/relaxed/tensor_backend.h"

namespace relaxcc {

namespace {
std::string grid_text(const std::vector<int>& grid) {
  std::string text;
  for (size_t i = 0; i < grid.size(); ++i) text += (i ? "x" : "") + std::to_string(grid[i]);
  return text;
}

void check_grid(const std::vector<int>& grid, int size) {
  int64_t product = 1;
  for (int m : grid) {
    RELAXCC_ENFORCE(m >= 1, InvalidArgument, "group_average: grid ", grid_text(grid),
                    " has a dimension below 1");
    product *= m;
    RELAXCC_ENFORCE(product <= int64_t{1} << 31, InvalidArgument, "group_average: grid ",
                    grid_text(grid), " is too large");
  }
  const int64_t slice = product / grid.back();  // ranks per slice of the last axis
  RELAXCC_ENFORCE(product >= size && (size + slice - 1) / slice == grid.back(), InvalidArgument,
                  "group_average: grid ", grid_text(grid), " (", product, " places) does not fit ",
                  size,
                  " ranks: it needs at least as many places, and no empty slice along its "
                  "last axis");
}
}  // namespace

std::vector<int> group_members(const GroupAverageOptions& options, int rank, int size) {
  RELAXCC_ENFORCE(options.round >= 1, InvalidArgument, "group_average: round ", options.round,
                  ", expected >= 1");
  RELAXCC_ENFORCE(rank >= 0 && rank < size, InvalidArgument, "group_average: rank ", rank, " of ",
                  size);
  std::vector<int> members;
  if (options.random_groups > 0) {
    const int r = options.random_groups;
    RELAXCC_ENFORCE(r <= size, InvalidArgument, "group_average: ", r, " random groups of ", size,
                    " ranks");
    std::vector<int> order(static_cast<size_t>(size));
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 rng(Fnv1a().u64(options.seed).u64(options.round).value());
    // Fisher-Yates with the engine's raw output: the same on every rank and
    // every standard library (std::shuffle's use of the engine is unspecified).
    for (int i = size - 1; i > 0; --i)
      std::swap(order[i], order[rng() % static_cast<uint64_t>(i + 1)]);
    const int pos = static_cast<int>(std::find(order.begin(), order.end(), rank) - order.begin());
    int g = 0;
    while (static_cast<int64_t>(g + 1) * size / r <= pos) ++g;
    const int lo = static_cast<int>(static_cast<int64_t>(g) * size / r);
    const int hi = static_cast<int>(static_cast<int64_t>(g + 1) * size / r);
    members.assign(order.begin() + lo, order.begin() + hi);
  } else {
    const std::vector<int> grid = options.grid.empty() ? std::vector<int>{size} : options.grid;
    check_grid(grid, size);
    const size_t axis = static_cast<size_t>((options.round - 1) % grid.size());
    int64_t stride = 1;
    for (size_t a = 0; a < axis; ++a) stride *= grid[a];
    const int64_t coord = (rank / stride) % grid[axis];
    const int64_t base = rank - coord * stride;
    for (int64_t c = 0; c < grid[axis]; ++c)
      if (base + c * stride < size) members.push_back(static_cast<int>(base + c * stride));
  }
  std::sort(members.begin(), members.end());
  return members;
}

WorkPtr group_average(Communicator& comm, const TensorView& x, const ExecContext& ctx,
                      const GroupAverageOptions& options) {
  const int n = comm.size(), me = comm.rank();
  relaxed::require_host("group_average", me, x, ctx);
  const std::vector<int> members = group_members(options, me, n);
  const std::string what =
      options.random_groups > 0
          ? detail::concat("group_average random ", options.random_groups, " seed ", options.seed)
          : detail::concat("group_average grid ",
                           grid_text(options.grid.empty() ? std::vector<int>{n} : options.grid));
  if (options.deadline || options.adaptive || options.codec) {
    RELAXCC_ENFORCE(options.tag >= 0 && options.tag < comm.max_p2p_tag(), InvalidArgument, what,
                    ": tag ", options.tag, " outside [0, ", comm.max_p2p_tag() - 1, "]");
    relaxed::MixPlan plan;
    for (int m : members)
      if (m != me) plan.send_to.push_back(m);
    plan.recv_from = plan.send_to;
    plan.weights.assign(plan.recv_from.size(), 1.0);
    relaxed::MixCall call = relaxed::mix_call(what, options);
    call.codec = options.codec;
    return relaxed::mix(comm, x, ctx, plan, call);
  }
  GroupOptions key;
  // Groups of one round are disjoint; the round, the tag and the call tell
  // apart groups of the same members. The top bit stays clear.
  key.key =
      Fnv1a().bytes(what).u64(options.round).u64(static_cast<uint64_t>(options.tag)).value() >> 1;
  CommunicatorPtr group = comm.group(members, key);
  AllreduceOptions ar;
  static_cast<OpOptions&>(ar) = options;
  ar.op = ReduceOp::avg;
  // Counted on the ring (with stats), whatever the size: the bytes it
  // records, per member, are the bytes it moves.
  WorkPtr w = relaxed::counted_allreduce(*group, x, ctx, ar, options.stats, members);
  if (members.size() < 2) return w;
  // The group keeps itself alive until the round is done.
  return w->then([group](const Work&) {});
}

}  // namespace relaxcc
