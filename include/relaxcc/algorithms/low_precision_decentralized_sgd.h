// low_precision_decentralized_sgd: CHOCO-SGD (Koloskova, Stich, Jaggi, ICML
// 2019) on the ring, with compressed weight differences, through
// relaxcc/relaxed/choco_gossip.h. Weights, not gradients, travel.
//
// Every communication_interval steps, each bucket's weights go through one
// CHOCO round, started as soon as the bucket's gradients are ready
// (WeightRounds, bucket_weights.h): the bucket's q = Q(x - x_hat) goes to
// both ring neighbours, and
//   x += gamma * sum_j w_ij (x_hat_j - x_hat_i)
// with the public copies x_hat updated by the same decoded q on both sides;
// the frontend's optimizer then applies this rank's own gradients.
//
// Bytes per communicating step and rank: two encodings of the model (one to
// each neighbour; 8-bit min-max: about 1/4 of the f32 model plus 8 bytes
// per chunk each). Staleness: none without a deadline; the models differ
// by the consensus error (evaluate after average_model()).
//
// With a deadline (`deadline`: fixed, or learned per neighbour so that a
// straggler is not waited for) a round goes on without a neighbour whose q
// has not begun to arrive, and applies it in a later round: no q is lost,
// so the public copies stay equal (choco_gossip.h, rounds with a deadline).
//
// State (state_dict): every bucket's public copies, so a checkpoint resumes
// bit for bit. The copies belong to the bucket layout: a plan change that
// alters a bucket restarts its copies from zero on every rank (still
// consistent; CHOCO converges from any common copies), so the bucket tuner
// is not to change the buckets (depends_on_bucket_boundaries).
#pragma once

#include <memory>

#include "relaxcc/algorithm.h"
#include "relaxcc/algorithms/bucket_weights.h"
#include "relaxcc/algorithms/round_deadline.h"
#include "relaxcc/relaxed/choco_gossip.h"

namespace relaxcc::algorithms {

struct LowPrecisionDecentralizedSgdOptions {
  // Bagua's low-precision decentralized algorithm: MinMaxUInt8 (relaxcc's
  // minmax 8-bit, chunks of 2048).
  kernels::CompressorConfig codec;
  // Consensus step size in (0, 1]. CHOCO tunes it per codec and topology
  // (no single default in the paper); 0.8 is relaxcc's, tuned on the ring
  // with 8-bit min-max in the convergence harness: at 4 ranks 0.6 needs
  // 1.92x gradient_allreduce's steps, 0.8 1.12x, and 1.0 diverges at
  // lr = 1 / L (I + gamma (W - I) then has the ring's eigenvalue -1/3).
  double gamma = 0.8;
  // Bagua: communication_interval=1.
  int communication_interval = 1;
  // Point-to-point tags: bucket b's rounds use tag + 2 b and tag + 2 b + 1.
  int tag = 32000;
  // How long a round waits for each neighbour (none: for both, always).
  RoundDeadlineOptions deadline;
};

class LowPrecisionDecentralizedSgd final : public WeightRounds {
 public:
  // Throws InvalidArgument for an interval < 1, gamma outside (0, 1], an
  // invalid codec or a negative deadline.
  explicit LowPrecisionDecentralizedSgd(LowPrecisionDecentralizedSgdOptions options = {});
  // The learned deadline of the rounds (null without one).
  const AdaptiveDeadline* learned_deadline() const { return deadline_.adaptive(); }
  std::string name() const override { return "low_precision_decentralized_sgd"; }
  AlgorithmCapabilities capabilities() const override;
  // With a deadline: settles every bucket's copies with the neighbours
  // (ChocoGossip::settle), so that a checkpoint or the end leaves no q in
  // flight.
  void drain(std::chrono::milliseconds timeout) override;
  // Drains, but on a poisoned communicator (a rank that unwinds alone).
  void shutdown(std::chrono::milliseconds timeout) override;
  // Needs settled copies after rounds with a deadline (drain first):
  // InvalidArgument otherwise.
  StateDict state_dict() const override;
  // InvalidArgument for a checkpoint of another bucket plan.
  void load_state_dict(const StateDict& state) override;

 private:
  WorkPtr start_round(int bucket, uint64_t round, const TensorView& weights) override;
  void bound() override;
  LowPrecisionDecentralizedSgdOptions options_;
  RoundDeadline deadline_;
  std::vector<std::unique_ptr<ChocoGossip>> gossip_;
};

}  // namespace relaxcc::algorithms
