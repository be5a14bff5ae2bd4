#include "relaxcc/relaxed/gossip.h"

#include <cmath>
#include <numeric>

#include "relaxcc/errors.h"
#include "src/relaxed/compressed_shards.h"
#include "src/relaxed/peer_mixing.h"
#include "src/relaxed/tensor_backend.h"

namespace relaxcc {

std::string_view gossip_mode_name(GossipMode mode) noexcept {
  switch (mode) {
    case GossipMode::all:
      return "all";
    case GossipMode::ring:
      return "ring";
    case GossipMode::shift_one:
      return "shift_one";
    case GossipMode::exponential:
      return "exponential";
  }
  return "unknown";
}

GossipMode parse_gossip_mode(std::string_view name) {
  for (GossipMode m :
       {GossipMode::all, GossipMode::ring, GossipMode::shift_one, GossipMode::exponential})
    if (gossip_mode_name(m) == name) return m;
  RELAXCC_THROW(InvalidArgument, "gossip mode '", name,
                "': expected all, ring, shift_one or exponential");
}

namespace {
// shift_one's partner of `rank` in `round` (circle method), -1 when it sits out.
int circle_partner(int rank, int n, uint64_t round) {
  const int m = n % 2 == 0 ? n : n + 1;  // with a dummy rank m-1 when n is odd
  const int k = m - 1;                   // odd: rounds of the tournament
  const int r = static_cast<int>((round - 1) % static_cast<uint64_t>(k));
  int partner = -1;
  if (rank == m - 1) {
    for (int i = 0; i < k; ++i)
      if (((r - i) % k + k) % k == i) partner = i;
  } else {
    const int p = ((r - rank) % k + k) % k;
    partner = p == rank ? m - 1 : p;
  }
  return partner < n ? partner : -1;
}
}  // namespace

GossipPeers gossip_peers(GossipMode mode, int rank, int size, uint64_t round) {
  RELAXCC_ENFORCE(size >= 1 && rank >= 0 && rank < size, InvalidArgument, "gossip: rank ", rank,
                  " of ", size);
  RELAXCC_ENFORCE(round >= 1, InvalidArgument, "gossip: round ", round, ", expected >= 1");
  RELAXCC_ENFORCE(mode != GossipMode::all, InvalidArgument,
                  "gossip: mode all is an allreduce, it has no peer list");
  GossipPeers p;
  if (size == 1) return p;
  switch (mode) {
    case GossipMode::ring:
      if (size == 2) {
        p.send_to = p.recv_from = {1 - rank};
        p.self_weight = 0.5;
        p.weights = {0.5};
      } else {
        const int left = (rank + size - 1) % size, right = (rank + 1) % size;
        p.send_to = p.recv_from = {left, right};
        p.self_weight = 1.0 / 3;
        p.weights = {1.0 / 3, 1.0 / 3};
      }
      break;
    case GossipMode::shift_one: {
      const int partner = circle_partner(rank, size, round);
      if (partner >= 0) {
        p.send_to = p.recv_from = {partner};
        p.self_weight = 0.5;
        p.weights = {0.5};
      }
      break;
    }
    case GossipMode::exponential: {
      int levels = 0;
      while ((1 << levels) < size) ++levels;
      const int d = 1 << static_cast<int>((round - 1) % static_cast<uint64_t>(levels));
      p.send_to = {(rank + d) % size};
      p.recv_from = {(rank - d % size + size) % size};
      p.self_weight = 0.5;
      p.weights = {0.5};
      break;
    }
    case GossipMode::all:
      break;
  }
  return p;
}

WorkPtr gossip(Communicator& comm, const TensorView& x, const ExecContext& ctx,
               const GossipOptions& options) {
  relaxed::require_host("gossip", comm.rank(), x, ctx);
  const std::string what = detail::concat("gossip ", gossip_mode_name(options.mode));
  if (options.mode == GossipMode::all) {
    RELAXCC_ENFORCE(options.weights.empty() && !options.deadline && options.adaptive == nullptr,
                    InvalidArgument,
                    "gossip all: the global average is an allreduce; it takes no weights and no "
                    "deadline (use group averaging with a deadline)");
    AllreduceOptions ar;
    static_cast<OpOptions&>(ar) = options;
    ar.op = ReduceOp::avg;
    // Counted on the ring, whatever the size: the bytes it records are the
    // bytes it moves.
    return relaxed::counted_allreduce(comm, x, ctx, ar, options.stats);
  }
  RELAXCC_ENFORCE(options.tag >= 0 && options.tag < comm.max_p2p_tag(), InvalidArgument, what,
                  ": tag ", options.tag, " outside [0, ", comm.max_p2p_tag() - 1, "]");
  GossipPeers peers = gossip_peers(options.mode, comm.rank(), comm.size(), options.round);
  relaxed::MixPlan plan{peers.send_to, peers.recv_from, peers.self_weight, peers.weights};
  if (!options.weights.empty()) {
    RELAXCC_ENFORCE_EQ(options.weights.size(), peers.recv_from.size() + 1, InvalidArgument, what,
                       " round ", options.round, ": weights (this rank's, then one per peer)");
    const double sum = std::accumulate(options.weights.begin(), options.weights.end(), 0.0);
    for (double w : options.weights)
      RELAXCC_ENFORCE(w >= 0 && std::isfinite(w), InvalidArgument, what, ": weight ", w,
                      " is negative or not finite");
    RELAXCC_ENFORCE(std::abs(sum - 1.0) <= 1e-9, InvalidArgument, what, ": mixing weights sum to ",
                    sum, ", expected 1");
    plan.self_weight = options.weights[0];
    plan.weights.assign(options.weights.begin() + 1, options.weights.end());
  }
  return relaxed::mix(comm, x, ctx, plan, relaxed::mix_call(what, options));
}

}  // namespace relaxcc
