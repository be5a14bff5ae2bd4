// diloco: the low-communication stack in one module. DiLoCo (Douillard et
// al., 2023), its streaming fragments (Streaming DiLoCo, Douillard et al.,
// 2025), one-step-delayed ("eager") outer updates (Kale et al., 2025),
// compressed pseudo-gradients with error feedback (SparseLoCo, 2025, is one
// configuration) and a hierarchical pseudo-gradient allreduce. Pseudo-
// gradients, not gradients, travel.
//
// Inner steps: every rank steps on its own gradients with the frontend's
// optimizer (the inner optimizer; DiLoCo: AdamW). Outer steps: the
// pseudo-gradients move in the Reducer's buckets (the bucket plan the
// algorithm is given: each gradient bucket's partner parameters, in the
// bucket's layout). The plan's buckets are cut into `fragments` fragments
// of whole buckets (plan order, balanced by elements); fragment p
// synchronises every inner_steps (H) steps, at inner steps k = o_p (mod H),
// o_p = p H / F, so the fragments sync in turn (one fragment: every H
// steps). At its sync fragment p, bucket by bucket in plan order,
//   1. takes bucket b's pseudo-gradient delta = theta_start - theta (the
//      progress of this round; theta_start: the parameters at the start of
//      the round) into the bucket's buffer,
//   2. starts the bucket's average over the ranks: f32 allreduce, or the
//      compressed allreduce of any codec of relaxcc/kernels/compressor.h
//      (dense kinds through compressed_allreduce.h, top-k and random-k
//      through sparse_allreduce.h) with worker- and server-side error
//      feedback, or SparseLoCo's chunk-wise top-k with quantized values
//      (relaxcc/kernels/chunk_topk.h: each rank encodes, with worker-side
//      error feedback, and the payloads are all-gathered and decoded in rank
//      order, so every rank holds the same average); hierarchical: full
//      precision within a node, compressed across nodes (dense codecs);
//   so bucket b travels while bucket b + 1's pseudo-gradient is computed
//   and compressed;
//   3. after `overlap_steps` further inner steps (0: at once; eager: H, at
//      the fragment's next sync) applies the outer optimizer (SGD,
//      relaxcc::Sgd, Nesterov momentum optional) to the synchronised global
//      parameters theta_g with the averaged pseudo-gradient, and sets
//        theta = theta_g - (theta_at_sync - theta),  theta_start = theta_g:
//      the local progress made while the average travelled stays on top of
//      the new global model (with no overlap, theta = theta_g). The next
//      pseudo-gradient is the progress since the sync.
// Streaming DiLoCo mixes theta = alpha theta + (1 - alpha) theta_g after an
// overlapped sync; relaxcc keeps the local progress instead (the eager
// update's rule), and offers no alpha.
//
// Buckets and the tuner. With one fragment and f32 pseudo-gradients the
// result does not depend on bucket boundaries (averaging is elementwise),
// and the bucket tuner may change the bucket sizes; with F > 1 (fragments
// are made of buckets) or a codec (chunk scales and top-k selections span a
// bucket) capabilities() declares depends_on_bucket_boundaries and the
// tuner leaves the plan alone. An exchange keeps the layout it started
// with, so a plan change while it travels does not disturb it. Outer state
// (theta_g, theta_start, the outer momentum, the worker-side residuals) is
// kept by flat parameter offset; server-side residuals by bucket (first
// flat offset and size), dropped for a bucket whose layout changed.
//
// Bytes per inner step and rank: 2 (n - 1) / n of the model's encoding per
// H steps (f32: 4 bytes per element; a codec's encoded size otherwise;
// chunk-wise top-k: (n - 1) payloads, all-gathered). Peak bandwidth: with F
// fragments one fragment (about 1 / F of the model) is in flight at a time.
// Staleness: an outer update lands overlap_steps (eager: H) inner steps
// after its sync. Ranks' models differ between syncs: evaluate after
// average_model().
//
// State (state_dict, after drain): theta_g, theta_start, the outer
// optimizer's momentum, the error feedback and any completed exchange not
// yet applied, so a checkpoint resumes bit for bit.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "relaxcc/algorithm.h"
#include "relaxcc/algorithms/bucket_weights.h"
#include "relaxcc/kernels/chunk_topk.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/topology.h"

namespace relaxcc::algorithms {

struct DilocoOptions {
  // H: inner steps per outer step (DiLoCo: 500).
  int inner_steps = 500;
  // The outer optimizer. The defaults, lr 1 without momentum, make the
  // outer step the average of the ranks' models (FedAvg's, local SGD's),
  // which converges over any inner optimizer that converges alone.
  // DiLoCo's Nesterov SGD at lr 0.7, momentum 0.9 (diloco_paper_options)
  // is tuned for an inner AdamW at a small learning rate: over an inner SGD
  // with momentum it overshoots by about lr / (1 - momentum) = 7 rounds of
  // progress and oscillates. nesterov applies when outer_momentum > 0.
  float outer_lr = 1.0f;
  float outer_momentum = 0.0f;
  bool nesterov = true;
  // Pseudo-gradient codec; unset: f32 (DiLoCo). Dense kinds (f16, bf16,
  // minmax 8/4/2/1-bit, sign) or topk / randomk (sparse, f32 values).
  std::optional<kernels::CompressorConfig> codec;
  // SparseLoCo's codec instead of `codec`: chunk-wise top-k with quantized
  // values (relaxcc/kernels/chunk_topk.h), all-gathered; flat only.
  std::optional<kernels::ChunkTopkConfig> chunk_topk;
  // With a codec: worker- and server-side error feedback (SparseLoCo keeps
  // error feedback in place of outer momentum).
  bool error_feedback = true;
  // beta: each sync first scales this rank's error-feedback residual by
  // beta, e <- beta e + delta (SparseLoCo's decayed accumulator, which
  // stands in for the outer momentum; 1: plain error feedback).
  float feedback_decay = 1.0f;
  // Streaming DiLoCo: F fragments syncing in turn (1: plain DiLoCo).
  int fragments = 1;
  // Inner steps an outer update lands after its sync, in [0, H]
  // (Streaming DiLoCo's tau; 0: DiLoCo).
  int overlap_steps = 0;
  // One-step-delayed ("eager") outer updates: overlap_steps = H.
  bool eager = false;
  // Full precision within each node, compressed across nodes (dense codecs;
  // the node layout of build_hierarchy: RELAXCC_RANKS_PER_NODE emulates it).
  bool hierarchical = false;
};

// DiLoCo's outer optimizer (Douillard et al., 2023): Nesterov SGD at lr 0.7,
// momentum 0.9, for an inner AdamW; the rest as the defaults.
DilocoOptions diloco_paper_options(int inner_steps = 500);

// SparseLoCo's recipe (arXiv 2508.15706): chunk-wise top-k of the
// pseudo-gradient (2 of every 64 elements, 3.1%; the paper: 1-3%) with the
// kept values quantized to 2 bits (min-max, one scale per 128 kept values),
// a decayed error-feedback accumulator in place of the outer momentum
// (feedback_decay 0.95, relaxcc's choice), outer SGD without momentum at
// lr 1.
DilocoOptions sparseloco_options(int inner_steps);

class Diloco final : public Algorithm {
 public:
  // Throws InvalidArgument for inner_steps < 1, a non-positive outer lr, a
  // momentum outside [0, 1), fragments < 1 or > inner_steps, overlap_steps
  // outside [0, H], feedback_decay outside (0, 1], an invalid codec or
  // chunk_topk configuration, both set, or hierarchical with a sparse codec
  // or chunk_topk.
  // init() throws InvalidArgument for more fragments than the plan has
  // buckets of parameters, or a bucket gradient without an f32 host partner
  // parameter.
  explicit Diloco(DilocoOptions options = {});
  ~Diloco() override;
  std::string name() const override { return "diloco"; }
  AlgorithmCapabilities capabilities() const override;
  void init(const AlgorithmContext& ctx) override;
  WorkPtr on_bucket_ready(const StepInfo&, int, const TensorView&) override { return nullptr; }
  void before_optimizer_step(const StepInfo& step) override;
  WorkPtr after_optimizer_step(const StepInfo& step) override;
  // Waits for the exchanges in flight (they stay unapplied until their
  // step); Timeout when one does not complete in time.
  void drain(std::chrono::milliseconds timeout) override;
  // The exact average of every parameter over the ranks (collective).
  void average_model(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));
  // Needs no exchange in flight (drain first): InvalidArgument otherwise.
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;
  // Outer steps applied, summed over fragments.
  int64_t outer_steps() const { return outer_steps_; }
  // Fragment p's buckets of the current plan: [first, last).
  std::pair<int, int> fragment(int p) const;

 private:
  struct Slice;
  struct Exchange;
  struct Fragment;
  int delay() const { return options_.eager ? options_.inner_steps : options_.overlap_steps; }
  bool compressed() const { return options_.codec.has_value() || options_.chunk_topk.has_value(); }
  void start_exchange(Fragment& f, int64_t k);
  WorkPtr average(Exchange& e, int bucket, int64_t k);
  // Waits for f's exchanges and moves their averages (and residuals) into
  // the flat state.
  void finish(Fragment& f, std::chrono::milliseconds timeout);
  void apply(Fragment& f);

  DilocoOptions options_;
  AlgorithmContext ctx_;
  HierarchicalComms hierarchy_;
  bool have_hierarchy_ = false;
  // Flat state over the parameters (FlatParameters order), by flat offset.
  std::vector<int64_t> flat_of_;  // registration index -> flat offset, or -1
  int64_t numel_ = 0;
  std::vector<float> global_, start_, at_sync_, averaged_, residual_;
  std::map<std::string, std::vector<float>> server_;  // by bucket key
  // The plan's buckets of parameters (empty and non-f32 buckets left out).
  std::vector<std::vector<Slice>> buckets_;
  std::vector<int64_t> bucket_numel_;
  std::vector<std::unique_ptr<Fragment>> fragments_;
  std::unique_ptr<Optimizer> outer_;
  int64_t outer_steps_ = 0;
};

}  // namespace relaxcc::algorithms
