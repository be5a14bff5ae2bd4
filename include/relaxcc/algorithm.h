// Algorithm: the contract every module in algorithms/ implements, written
// against the core's public primitives alone. An algorithm decides what a
// bucket's communication is and what happens around the optimizer step;
// the Reducer (reducer.h) calls its hooks. Hooks that communicate return a
// Work (null when there is nothing to wait for).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "relaxcc/bucket_plan.h"
#include "relaxcc/communicator.h"
#include "relaxcc/optimizer.h"
#include "relaxcc/state_dict.h"
#include "relaxcc/tunables.h"

namespace relaxcc {

struct AlgorithmCapabilities {
  // Results depend on where buckets begin and end (per-bucket compression
  // scales, say): the bucket tuner leaves such algorithms alone.
  bool depends_on_bucket_boundaries = false;
  // Gradients go through buckets during backward (else only weights move).
  bool communicates_gradients = true;
  // optimizer_step() replaces the frontend's optimizer (DiLoCo, Q-Adam).
  bool owns_optimizer_step = false;
  // That optimizer step takes the frontend optimizer's learning rate
  // (set_learning_rate; Q-Adam), so the frontend's schedule drives it.
  bool takes_learning_rate = false;
  // init() accepts a communicator of another size (an elastic Reducer's view
  // change, reducer.h): state carries over as docs/algorithms.md states, and
  // load_state_dict() of a state saved at a step's start undoes that step's
  // partial effects (the step is then run again). Such an algorithm
  // communicates only in on_bucket_ready and on_backward_end, inside the
  // Reducer's synchronize(), where a view change happens.
  bool survives_view_change = false;
};

// What an algorithm sees of the job. `flat_offset[i]` is tensor i's offset
// in the concatenation of all registered tensors in registration order: the
// key for per-parameter state, stable across bucket plan rebuilds.
struct AlgorithmContext {
  CommunicatorPtr comm;
  const std::vector<TensorSpec>* tensors = nullptr;
  const BucketPlan* plan = nullptr;
  std::vector<int64_t> flat_offset;
  Tunables tunables;
  ExecContext exec;
};

struct StepInfo {
  int64_t step = 0;  // optimizer steps completed before this one
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual std::string name() const = 0;
  virtual AlgorithmCapabilities capabilities() const = 0;

  // Binds the algorithm to tensors and buckets; called again after every
  // plan rebuild (state keyed by flat offset carries over).
  virtual void init(const AlgorithmContext& ctx) = 0;
  // Before forward (send last step's delta, snapshot weights, ...).
  virtual WorkPtr on_step_begin(const StepInfo&) { return nullptr; }
  // Bucket `bucket` of gradients is complete in `data`: start its
  // communication. The Reducer calls this in bucket order on every rank.
  virtual WorkPtr on_bucket_ready(const StepInfo& step, int bucket, const TensorView& data) = 0;
  // Whether step `step` combines gradients across ranks: its
  // on_bucket_ready starts a reduction of the bucket's gradients whose
  // result replaces them (gradient allreduce, a warmup step). False for a
  // step whose gradients stay on this rank (DiLoCo's inner steps, local
  // SGD's local steps, the weight rounds of decentralized_sgd and
  // moshpit_sgd): the Reducer then settles unused tensors by this rank's own
  // marks, with no collective of its own in that step, and copies no
  // gradients into buckets (copied gradients), so on_bucket_ready's `data`
  // need not hold the step's gradients and must not be read (reducer.h). Every rank must
  // answer alike for a step. Default: capabilities().communicates_gradients.
  virtual bool reduces_gradients(const StepInfo&) const {
    return capabilities().communicates_gradients;
  }
  // Every bucket's Work completed.
  virtual WorkPtr on_backward_end(const StepInfo&) { return nullptr; }
  virtual void before_optimizer_step(const StepInfo&) {}
  // Only when capabilities().owns_optimizer_step.
  virtual void optimizer_step(const StepInfo&, Optimizer&) {}
  // Only when capabilities().takes_learning_rate: the learning rate of the
  // following optimizer steps (a schedule's current value).
  virtual void set_learning_rate(float) {}
  virtual WorkPtr after_optimizer_step(const StepInfo&) { return nullptr; }
  // True at the step where the algorithm changes phase (warmup ends): the
  // frontend resets what depends on the phase (optimizer state, say).
  virtual bool need_reset(const StepInfo&) const { return false; }
  // Completes everything in flight (before a checkpoint).
  virtual void drain(std::chrono::milliseconds) {}
  virtual void shutdown(std::chrono::milliseconds timeout) { drain(timeout); }
  virtual StateDict state_dict() const { return {}; }
  virtual void load_state_dict(const StateDict&) {}
  // The part of the state that every rank holds alike (optimizer moments
  // computed from averaged gradients, say), which a newcomer receives when an
  // elastic Reducer admits it (reducer.h); per-rank state such as a worker's
  // error-feedback residual is not in it (a newcomer starts without one).
  // Loaded into a newcomer's algorithm before its init(). Default: none.
  virtual StateDict replicated_state_dict() const { return {}; }
  virtual void load_replicated_state_dict(const StateDict&) {}
};

using AlgorithmPtr = std::shared_ptr<Algorithm>;

}  // namespace relaxcc
