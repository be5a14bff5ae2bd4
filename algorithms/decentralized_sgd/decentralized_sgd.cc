#include "relaxcc/algorithms/decentralized_sgd.h"

#include "relaxcc/errors.h"

namespace relaxcc::algorithms {

DecentralizedSgd::DecentralizedSgd(DecentralizedSgdOptions options)
    : WeightRounds("decentralized_sgd", options.communication_interval),
      options_(options),
      deadline_(options.deadline, "decentralized_sgd") {
  RELAXCC_ENFORCE(!(deadline_.enabled() && options_.mode == GossipMode::all), InvalidArgument,
                  "decentralized_sgd: mode all is an allreduce and takes no deadline (choose "
                  "ring, shift_one or exponential)");
  RELAXCC_ENFORCE(options_.consensus_step > 0 && options_.consensus_step <= 1, InvalidArgument,
                  "decentralized_sgd: consensus_step must be in (0, 1], got ",
                  options_.consensus_step);
}

WorkPtr DecentralizedSgd::start_round(int bucket, uint64_t round, const TensorView& weights) {
  GossipOptions o;
  o.mode = options_.mode;
  o.round = round;
  o.tag = options_.tag + 2 * bucket;
  o.label = "decentralized_sgd bucket " + std::to_string(bucket);
  deadline_.apply(o);
  if (options_.consensus_step < 1.0 && options_.mode != GossipMode::all) {
    const Communicator& comm = *context().comm;
    const GossipPeers peers = gossip_peers(options_.mode, comm.rank(), comm.size(), round);
    const double alpha = options_.consensus_step;
    o.weights.push_back(1.0 - alpha * (1.0 - peers.self_weight));
    for (double w : peers.weights) o.weights.push_back(alpha * w);
  }
  return gossip(*context().comm, weights, context().exec, o);
}

}  // namespace relaxcc::algorithms
