// The exchange every decentralized primitive is made of: send this rank's
// tensor to some peers, take the tensors of some peers (each by a deadline,
// if any), and replace this rank's tensor with a weighted average of what
// arrived. Written against the Communicator interface only.
//
// Wire: per peer, two round messages of point_to_point (collectives/
// point_to_point.h), a 64-byte MixHeader on `tag` (what the rank calls, the
// codec included: ranks that disagree get PeerMismatch; and whether the
// sender leaves the receiver out as a straggler) and the data (or its
// compressed payload) on `tag` + 1, one point_to_point batch per peer and
// direction. A peer contributes when both arrived by its deadline; its
// weight then counts. With an adaptive deadline each peer has its own wait
// (AdaptiveDeadline::wait_for: none for a straggler), and a peer whose
// header (or the start of its data) arrived by then has until the adaptive
// cap for the rest (P2POptions::started_deadline): the deadline leaves out
// peers that have not started, not transfers that take longer than the
// small tensors' the deadline learned from. A straggler's probe receives
// its message outside the round (the round neither waits for it nor mixes
// it) and tells the deadline how far behind it was. Mixing:
//   x <- (w_self x + sum_j w_j y_j) / (w_self + sum_j w_j), j over arrived.
// The sum runs in double, in recv_from order, so two ranks that mix each
// other's values with equal weights get bitwise equal results.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "relaxcc/communicator.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/relaxed/adaptive_deadline.h"
#include "relaxcc/relaxed/relaxed_stats.h"

namespace relaxcc::relaxed {

struct MixPlan {
  std::vector<int> send_to;    // distinct peers
  std::vector<int> recv_from;  // distinct peers
  double self_weight = 1.0;
  std::vector<double> weights;  // one per recv_from
};

struct MixCall {
  std::string what;  // "gossip ring": ranks must call the same (PeerMismatch otherwise)
  uint64_t round = 1;
  int tag = 0;
  std::optional<std::chrono::steady_clock::time_point> deadline;
  AdaptiveDeadline* adaptive = nullptr;  // with no deadline: per peer, adaptive->wait_for
  RelaxedStats* stats = nullptr;
  OpOptions op;  // priority, label, after
  // Set: the tensor travels compressed (f32 only, no `after`): each rank
  // mixes its own exact tensor with its peers' decoded ones.
  std::optional<kernels::CompressorConfig> codec;
};

// The call of a primitive whose options carry round, tag, deadline,
// adaptive and stats (GossipOptions, GroupAverageOptions).
template <typename Options>
MixCall mix_call(std::string what, const Options& options) {
  MixCall call;
  call.what = std::move(what);
  call.round = options.round;
  call.tag = options.tag;
  call.deadline = options.deadline;
  call.adaptive = options.adaptive;
  call.stats = options.stats;
  call.op = options;
  return call;
}

// Floating dtypes only (InvalidArgument otherwise).
WorkPtr mix(Communicator& comm, const TensorView& x, const ExecContext& ctx, const MixPlan& plan,
            const MixCall& call);

}  // namespace relaxcc::relaxed
