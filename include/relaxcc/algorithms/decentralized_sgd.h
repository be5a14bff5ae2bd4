// decentralized_sgd: D-PSGD (Lian et al., NeurIPS 2017) as Bagua's
// decentralized algorithm runs it (BaguaSys/bagua,
// bagua/torch_api/algorithms/decentralized.py). Weights, not gradients,
// travel.
//
// Every communication_interval steps, each bucket's weights go through one
// gossip round (relaxcc/relaxed/gossip.h) in the chosen peer mode, started
// as soon as the bucket's gradients are ready (WeightRounds,
// bucket_weights.h), and the frontend's optimizer applies this rank's own
// gradients to the mixed weights:
//   x_{t+1} = W_t x_t - lr * g_r(x_t).
// Other steps are local steps. Round k of every bucket uses the same peers.
//
// Bytes per communicating step and rank: the model once per peer of the
// mode (all: an allreduce, 2 (n-1)/n of the model; ring: 2 models;
// shift_one and exponential: 1 model). Staleness: none (the weights mixed
// are this step's); ranks' models differ by the consensus error, so
// evaluate after average_model() (an exact allreduce of every parameter).
// With a deadline a round goes on without late peers, renormalising the
// weights (mode all takes no deadline).
#pragma once

#include <memory>

#include "relaxcc/algorithm.h"
#include "relaxcc/algorithms/bucket_weights.h"
#include "relaxcc/algorithms/round_deadline.h"
#include "relaxcc/relaxed/gossip.h"

namespace relaxcc::algorithms {

struct DecentralizedSgdOptions {
  // Bagua: peer_selection_mode="all".
  GossipMode mode = GossipMode::all;
  // Bagua: communication_interval=1.
  int communication_interval = 1;
  // Consensus step size alpha in (0, 1]: mixing with I + alpha (W_t - I) in
  // place of W_t (this rank keeps 1 - alpha (1 - w_rr) of its weight, the
  // peers' weights are scaled by alpha; 1/2 is the "lazy" (I + W) / 2). An
  // eigenvalue lambda of W becomes 1 - alpha (1 - lambda): the ring's W has
  // lambda = -1/3 at 4 ranks, and x <- W x - lr g diverges there at
  // lr = 1 / L (the convergence harness), but not with alpha = 0.8. Bagua
  // mixes with W: 1. Ignored by mode all.
  double consensus_step = 1.0;
  // Bagua waits for every peer.
  RoundDeadlineOptions deadline;
  // Point-to-point tags: bucket b's rounds use tag + 2 b and tag + 2 b + 1.
  // Runs that share a communicator one after the other with deadlines take
  // different tags (late messages are told apart by round within a tag).
  int tag = 31000;
};

class DecentralizedSgd final : public WeightRounds {
 public:
  // Throws InvalidArgument for an interval < 1, a deadline with mode all or
  // a negative deadline.
  explicit DecentralizedSgd(DecentralizedSgdOptions options = {});
  std::string name() const override { return "decentralized_sgd"; }
  // The learned deadline of the rounds (null without one): its peers() say
  // how often each peer was left out.
  const AdaptiveDeadline* learned_deadline() const { return deadline_.adaptive(); }

 private:
  WorkPtr start_round(int bucket, uint64_t round, const TensorView& weights) override;
  DecentralizedSgdOptions options_;
  RoundDeadline deadline_;
};

}  // namespace relaxcc::algorithms
