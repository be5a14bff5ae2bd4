// cocktail_sgd: CocktailSGD (Wang et al., ICML 2023; DS3Lab/CocktailSGD,
// data_parallel/dist_dp_cocktail_sgd.py). Weights, not gradients, travel.
//
// Every rank steps on its own gradients (the frontend's optimizer). After
// step t every rank sends the delta of its model x_r against the last
// synchronised model g, d_r = x_r - g, through an owner schedule over n
// balanced shards of the flat parameters (registered parameter tensors,
// concatenated in registration order); rank j owns shard j:
//   1. each rank encodes each shard of d_r with the cocktail codec
//      (relaxcc/kernels/compressor.h): random-k (the rolling stride
//      round(1 / random_ratio), shifted by one each step, so no mask
//      travels), then top-k among those, then min-max quantization of the
//      kept values in chunks; and decodes its own payloads, C(d_r);
//   2. an alltoallv sends shard j's payload to owner j;
//   3. the owner averages the n decoded payloads, adds its server residual,
//      and encodes the result with the same codec (server-side error
//      feedback: what the payload misses stays in the residual);
//   4. an allgatherv forwards the owners' payloads; every rank decodes them
//      into the same average a.
// The exchange runs while step t + 1 computes (one step of staleness) and is
// applied after step t + 1's optimizer step, before the next delta is taken:
//   x_r += a - C(d_r),   g += a.
// So what rank r's payload missed stays in its own model (worker-side error
// feedback, as in the reference) and g is the same on every rank.
// Warmup: the first warmup_steps steps allreduce gradients at full precision
// (the reference's uncompressed mode); compression starts after them, from
// g = the model before the first local step.
//
// Bytes per step and rank: (n - 1) / n of the encoded model twice (the
// alltoallv and the allgatherv), where the encoding keeps about
// random_ratio * topk_ratio of the elements at 4 bytes of index plus
// bits / 8 of value each, plus 8 bytes per chunk of kept values and a
// 48-byte header per shard. With topk_ratio 1 no index travels (every rank
// recomputes the random selection from the seed and step): random_ratio 0.2
// at 2 bits in chunks of 2048, the sparsest setting that passes the
// convergence harness (docs/algorithms.md), sends about 1/79 of f32
// gradient_allreduce's bytes, and about 1/120 with pack_payloads for
// bell-shaped deltas (what packing saves depends on the data).
//
// The ranks' models differ by what their payloads missed; average_model()
// gives every rank their exact average, for evaluation.
//
// State (state_dict, after drain): g, the server residual, and the exchange
// that completed but is not applied yet, so a checkpoint resumes bit for bit.
#pragma once

#include <memory>

#include "relaxcc/algorithm.h"
#include "relaxcc/kernels/compressor.h"

namespace relaxcc::algorithms {

// Defaults are the reference implementation's (the environment defaults of
// data_parallel/dist_dp_cocktail_sgd.py); its example fine-tuning scripts
// run random_ratio 0.1, topk_ratio 0.2, bits 4 (the paper's setting), which
// misses the convergence harness's consensus within 2x the steps of
// gradient_allreduce (docs/algorithms.md).
struct CocktailSgdOptions {
  // Fraction of the elements the random stage selects (RANDOMP_RATIO).
  double random_ratio = 0.5;
  // Fraction of the random selection top-k keeps (TOPK_RATIO).
  double topk_ratio = 0.5;
  // Bits per kept value: 8, 4, 2 or 1 (QUANT_BITS).
  int bits = 8;
  // Kept values per quantization chunk (QUANT_BUCKET_SIZE: 128).
  int64_t chunk = 128;
  // QUANT_STOCHASTIC: 0 (round to nearest).
  kernels::Rounding rounding = kernels::Rounding::nearest;
  // RANDOM_METHOD: random_rolling.
  kernels::RandomKMode random_mode = kernels::RandomKMode::rolling;
  // Steps of full-precision gradient allreduce first (the reference's
  // compression flag is set by its training loop; its example runs train
  // with --train-warmup-steps 0).
  int warmup_steps = 0;
  // Shared by every rank: the random selection of stratified mode, the
  // streams of stochastic rounding.
  uint64_t seed = 0;
  // Not in the reference: every payload is packed losslessly with zstd
  // (relaxcc/kernels/payload_packing.h) before it travels, and each
  // transfer is preceded by an exchange of the packed sizes. The models
  // follow the same trajectory, bit for bit; the bytes shrink where the
  // codes are skewed (2-bit codes of bell-shaped deltas: to about 65%).
  bool pack_payloads = false;

  // The sparsest setting that passes the convergence harness
  // (docs/algorithms.md): random_ratio 0.2, topk_ratio 1 (no index travels),
  // 2 bits, chunks of 2048; the other fields at their defaults.
  static CocktailSgdOptions sparse() {
    CocktailSgdOptions o;
    o.random_ratio = 0.2;
    o.topk_ratio = 1.0;
    o.bits = 2;
    o.chunk = 2048;
    return o;
  }
};

class CocktailSgd final : public Algorithm {
 public:
  // Throws InvalidArgument for a ratio outside (0, 1], bits outside 1..8 or
  // not 8, 4, 2, 1, a chunk < 1 or warmup_steps < 0.
  explicit CocktailSgd(CocktailSgdOptions options = {});
  std::string name() const override { return "cocktail_sgd"; }
  AlgorithmCapabilities capabilities() const override;
  void init(const AlgorithmContext& ctx) override;
  WorkPtr on_bucket_ready(const StepInfo& step, int bucket, const TensorView& data) override;
  // Warmup steps only.
  bool reduces_gradients(const StepInfo& step) const override { return warming_up(step); }
  void before_optimizer_step(const StepInfo& step) override;
  WorkPtr after_optimizer_step(const StepInfo& step) override;
  bool need_reset(const StepInfo& step) const override {
    return step.step == options_.warmup_steps;
  }
  // Waits for the exchange in flight (it stays unapplied until the next
  // step); Timeout when it does not complete in time (with packed
  // payloads too: the stage in flight poisons its group and is named).
  // An exchange that failed or timed out leaves the instance failed: the
  // ranks' synchronised models may differ, so later steps and state_dict()
  // throw CommunicationError until load_state_dict() restores a checkpoint
  // (drain() has nothing left to wait for; average_model() still averages
  // the models exactly).
  void drain(std::chrono::milliseconds timeout) override;
  // Needs no exchange in flight (drain first): InvalidArgument otherwise.
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;
  // Applies the exchange in flight, then replaces every parameter by its
  // exact average over the ranks (both within `timeout`), for
  // evaluation. Collective: every rank calls it between steps; training may
  // go on after it.
  void average_model(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));
  // Exchanges started (compressed steps so far).
  int64_t exchanges() const { return exchanges_; }

 private:
  struct Exchange;
  bool warming_up(const StepInfo& step) const { return step.step < options_.warmup_steps; }
  kernels::CompressorConfig codec(int64_t step) const;
  // The registered parameters, concatenated in the flat order.
  void gather_params(std::vector<float>& flat) const;
  // Applies the completed exchange, if one is pending, and takes the next
  // delta into e.delta.
  void apply_and_take_delta(Exchange& e);
  // Starts the exchange of exchange_->delta, taken after step `step`.
  void start_exchange(int64_t step);
  // Its stages with packed payloads; the Work completes after the last.
  WorkPtr start_packed_exchange(const std::shared_ptr<Exchange>& e);
  // Waits for the exchange in flight within `timeout` (negative: each
  // wait's default) and marks it pending. On failure the instance is
  // failed (failed_): the exception propagates, and later calls throw.
  void wait_exchange(std::chrono::milliseconds timeout);
  // Marks the instance failed (`what` failed: `why`) and drops the exchange.
  void fail_exchange(const std::string& what, const std::string& why);
  void check_not_failed() const;

  CocktailSgdOptions options_;
  AlgorithmContext ctx_;
  std::vector<int> params_;        // registered parameter tensors, in order
  std::vector<int64_t> param_at_;  // their offsets in the flat order
  int64_t numel_ = 0;              // flat parameter elements
  std::vector<int64_t> shard_begin_, shard_count_;
  std::vector<float> global_;  // g (empty until compression starts)
  std::vector<float> server_;  // server residual of the owned shard
  std::shared_ptr<Exchange> exchange_;
  CommunicatorPtr packed_group_;  // every rank, split once: the packed exchanges' own order
  const Communicator* packed_parent_ = nullptr;  // what packed_group_ was split from
  WorkPtr in_flight_;                            // the exchange's Work
  bool pending_ = false;                         // an exchange waits to be applied
  std::string failed_;                           // why an exchange failed (then no more run)
  int64_t exchanges_ = 0;
};

}  // namespace relaxcc::algorithms
