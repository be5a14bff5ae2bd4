// Decentralized gossip: each rank replaces its tensor with a weighted
// average of its own and a few peers' tensors (D-PSGD, SGP, Bagua's
// decentralized algorithm). One call is one round; every rank calls it with
// the same mode and round number, rounds increasing. (tag, round) names a
// call: calls in flight together on one communicator need different tags,
// and a tag's rounds keep increasing across the users of that tag (an
// AsyncModelAverager or ChocoGossip on the same tag included).
//
// Peer modes and their mixing matrices W (x <- W x over the ranks):
//   all          the global average: W = 11^T / n (an allreduce; no
//                deadline, no weights; with stats, on the ring:
//                relaxed_stats.h).
//   ring         left and right neighbours, weights 1/3 each: W = (I + P +
//                P^T) / 3 with P the shift r -> r+1; on 2 ranks, the one
//                neighbour, 1/2 each.
//   shift_one    rotating pairs, as in Bagua: round t pairs the ranks by the
//                circle method (a round-robin tournament: over n-1 rounds,
//                or n with an odd n, every pair meets once), and each pair
//                averages, 1/2 each. With an odd n one rank sits each round
//                out (its row of W is e_r).
//   exponential  one peer at distance 2^k, k = (t - 1) mod ceil(log2 n), as
//                in SGP's and AD-PSGD's topologies: rank r sends to r + 2^k
//                and averages with r - 2^k, 1/2 each: W = (I + P^(2^k)) / 2.
// Each W above is doubly stochastic, so the sum over ranks (and the mean)
// is preserved up to float rounding; exactly on dyadic data. Custom
// weights (GossipOptions::weights: this rank's, then one per peer in the
// mode's order) must sum to 1; they keep the sum only when W stays doubly
// stochastic, which is the caller's choice.
//
// Slow peers: with a deadline (fixed, or AdaptiveDeadline, learned per peer)
// a round goes on without the peers whose tensor has not arrived, and the
// weights are renormalised over those that did: x <- (w_r x_r + sum_j w_j x_j) / (w_r +
// sum_j w_j). The Work then reports them (Work::missing_peers); their late
// messages are recognised by their round and dropped, never applied to
// another round (point_to_point.h). A round with a missing peer does not
// preserve the sum. A peer this rank leaves out as a straggler is told so in
// this rank's message (RelaxedCounts::left_out_by on its side). Messages to
// a straggler for rounds it has not reached yet wait for it (it takes each
// at its round): a peer behind by R rounds holds up to R of them. Dead peers still end the job:
// Open MPI 4.1 has no fault-tolerant MPI (mpi_communicator.h).
//
// Ranks that disagree on the mode, the round or the tensor's size and
// dtype get PeerMismatch. The mixing runs where the round's last message
// completes (the engine thread, or a thread waiting on the Work): one pass
// over the tensor per peer, during which that engine moves nothing else.
#pragma once

#include <chrono>
#include <optional>
#include <string_view>
#include <vector>

#include "relaxcc/communicator.h"
#include "relaxcc/relaxed/adaptive_deadline.h"
#include "relaxcc/relaxed/relaxed_stats.h"

namespace relaxcc {

enum class GossipMode : uint8_t { all = 0, ring = 1, shift_one = 2, exponential = 3 };

std::string_view gossip_mode_name(GossipMode mode) noexcept;
// "all", "ring", "shift_one" or "exponential". Throws InvalidArgument.
GossipMode parse_gossip_mode(std::string_view name);

// The peers of one round for one rank: it sends to send_to, mixes in
// recv_from with `weights` (one each) and keeps self_weight of its own.
struct GossipPeers {
  std::vector<int> send_to;
  std::vector<int> recv_from;
  double self_weight = 1.0;
  std::vector<double> weights;
};
// Not for `all`. Throws InvalidArgument for a rank outside [0, size) or a
// round of 0.
GossipPeers gossip_peers(GossipMode mode, int rank, int size, uint64_t round);

struct GossipOptions : OpOptions {
  GossipMode mode = GossipMode::ring;
  uint64_t round = 1;  // >= 1, increasing from call to call on a communicator
  // Empty: the mode's weights. Otherwise this rank's weight, then one per
  // peer in gossip_peers' recv_from order; they must sum to 1.
  std::vector<double> weights;
  // The round goes on without peers whose tensor has not arrived by then.
  std::optional<std::chrono::steady_clock::time_point> deadline;
  // Without a fixed deadline: each peer is waited for until the round's
  // start plus adaptive->wait_for(peer) (a straggler not at all), and the
  // arrivals update it (adaptive_deadline.h). A peer whose message has
  // begun to arrive by then is waited for until the start plus the
  // adaptive cap.
  AdaptiveDeadline* adaptive = nullptr;
  // Point-to-point tags `tag` and `tag` + 1 carry the round.
  int tag = 30000;
  RelaxedStats* stats = nullptr;
};

// One gossip round on `x`, in place. Returns the Work; Work::contributors()
// and missing_peers() name the peers mixed in and those left out.
WorkPtr gossip(Communicator& comm, const TensorView& x, const ExecContext& ctx,
               const GossipOptions& options = {});

}  // namespace relaxcc
