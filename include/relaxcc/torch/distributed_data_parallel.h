// relaxcc::torch::DistributedDataParallel: a drop-in data-parallel wrapper
// for libtorch (the C++ frontend of PyTorch), shaped like PyTorch's DDP and
// Bagua's with_bagua, that runs any relaxcc Algorithm.
//
// Switching a plain libtorch training loop to data parallel takes three
// lines (examples/torch_ddp): include relaxcc/torch/ddp.h, wrap the module
// and its optimizer, and call ddp.step() where the loop called
// optimizer.step():
//
//   relaxcc::torch::DistributedDataParallel ddp(*model, optimizer);  // gradient_allreduce
//   ...
//   loss.backward();
//   ddp.step();  // was optimizer.step()
//
// What runs where:
//   construction  (collective) registers every parameter that requires a
//                 gradient with a Reducer (relaxcc/reducer.h), which checks
//                 that ranks registered the same names, shapes and dtypes
//                 (PeerMismatch otherwise); broadcasts parameters and
//                 buffers from rank 0; installs one post hook on each
//                 parameter's gradient accumulator. A tensor registered
//                 under several names (tied or shared weights) is one
//                 parameter, under its first name, as in PyTorch DDP.
//   backward      each accumulator's post hook fires after the gradient was
//                 accumulated into param.grad (libtorch's Tensor::register_hook
//                 fires before accumulation, which would lose accumulated
//                 gradients) and marks the gradient ready, so its bucket's
//                 communication starts while backward goes on. The first hook
//                 of a backward queues a callback on the autograd engine that
//                 runs Reducer::synchronize() at the end of backward (unused
//                 parameters are settled there, by agreement, never by a hang).
//                 Hooks and that callback run on the thread that runs
//                 backward (the calling thread for CPU tensors); communication
//                 runs on the communicator's engine thread, and copies into
//                 and out of buckets on the Reducer's copy thread.
//   step()        the algorithm's hooks around the optimizer step: the wrapped
//                 torch optimizer steps, unless the algorithm owns the step
//                 (qadam), in which case the algorithm updates the parameters
//                 (qadam with the torch optimizer's learning rate, read at
//                 construction and at every step, so a torch scheduler
//                 applies: every parameter group must have the same lr,
//                 InvalidArgument otherwise; its betas, eps and weight decay
//                 are QAdamOptions');
//                 algorithms that move weights (local_sgd, cocktail_sgd) run
//                 after it. A parameter whose gradient no rank produced in the
//                 step (unused in forward everywhere; in a step whose
//                 gradients stay on each rank, unused on this rank) has an
//                 undefined param.grad while the torch optimizer steps, so the
//                 optimizer leaves it alone (no momentum, no weight decay), as
//                 PyTorch DDP leaves such a gradient undefined; param.grad is
//                 the Reducer's memory again afterwards. Buffers are then
//                 broadcast from rank 0
//                 (broadcast_buffers, as DDP's), so the next forward starts
//                 from rank 0's batch-norm statistics.
//
// Gradients: param.grad always lives in memory the Reducer knows: its own
// tensor (copied into buckets by the Reducer) or, with
// options.reducer.gradient_as_bucket_view, a view of bucket memory that is
// re-pointed after each plan rebuild. A param.grad that the user replaced
// (or reset to undefined) is copied back into that memory by the hook.
//
// Gradient accumulation: backward passes inside a no_sync() scope
// communicate nothing and accumulate into param.grad; the first backward
// outside it communicates the sum. step() after a no_sync backward with no
// synchronized backward since the last step throws InvalidArgument.
//
// Uneven inputs: every rank must run the same number of synchronized
// backward passes. A rank that runs out of data calls finish(). With
// check_uneven_inputs (the default) each synchronized backward starts with a
// 16-byte allgather of (steps, has data), so when one rank finished while
// another went on, both throw InvalidArgument naming the ranks that finished
// and the ranks that went on, with their step counts, instead of timing out.
// (There is no Join: ranks do not shadow each other's collectives.)
//
// Checkpoints: save(prefix) writes prefix.rank<R> (each rank its own file:
// algorithm state is per rank) with the parameters, buffers, the torch
// optimizer's state, the algorithm's state_dict (after drain), the
// Reducer's bucket plan (Reducer::state_dict: the plan rebuilt after the
// first step included) and the step count; load(prefix) (collective) drains
// the algorithm, reads and checks every rank's file, adopts the saved plan
// on every rank, then restores the rest in place, bit for bit: the run goes
// on as the saved one would have, for every algorithm whose module promises
// a bit-for-bit resume. Every rank
// throws InvalidArgument when any rank's file was written by another rank
// count (a checkpoint of fewer ranks included: the extra ranks have no file
// and report the rank count too), and when any rank cannot load its file (by
// another rank, for another model, unreadable, a drain that failed: that
// rank's error says why), or when the files' bucket plans differ; nothing
// is restored then. When the torch optimizer
// or the algorithm refuses its state on any rank, every rank puts back what
// it had (parameters, buffers, bucket plan, optimizer and algorithm state)
// and throws InvalidArgument.
//
// Misuse raises a clear error: wrapping a module that a live
// DistributedDataParallel wraps already (InvalidArgument naming the
// parameter), parameters that are not contiguous f32 host tensors
// (Unsupported), models that differ across ranks (PeerMismatch).
//
// Failing together (relaxcc/collective_setup.h): construction runs this
// rank's checks before its first collective and agrees on every rank's
// outcome, so a check that fails on one rank alone (an f64 parameter there)
// fails every rank at once, the others throwing the same error type naming
// that rank and its message; the communicator stays usable. The Reducer
// does the same for its plan and the algorithm's init (reducer.h). An error
// that one rank raises later in construction or in load() (a collective
// that fails there) poisons the communicator: the others fail at once with
// CommunicatorPoisoned naming that rank and the error, rather than at
// their timeout.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "relaxcc/algorithm.h"
#include "relaxcc/algorithms/step_offset.h"
#include "relaxcc/communicator.h"
#include "relaxcc/reducer.h"

namespace relaxcc::torch {

struct DdpOptions {
  // Bucket caps, gradient_as_bucket_view, plan rebuild, timeout, and
  // elastic membership (reducer.h): with reducer.elastic set, training goes
  // on without lost members, newcomers are admitted at step ends (admit),
  // and communicator() follows the Reducer's view. A newcomer's construction
  // (elastic->newcomer) is its half of the admission: no construction
  // agreement, no broadcast from rank 0 (its parameters come with the
  // training state, which elastic->load_state loads; save_state and
  // load_state are the application's: the module's parameters and buffers,
  // the optimizer's state, the data position).
  ReducerOptions reducer;
  // Broadcast buffers (batch-norm statistics) from rank 0 after every step.
  // Not with reducer.elastic (a collective outside the Reducer's iteration,
  // which a view change could leave done on some survivors only).
  bool broadcast_buffers = true;
  // One 16-byte allgather per synchronized backward that turns uneven inputs
  // into InvalidArgument (see above). Not with reducer.elastic (as above).
  bool check_uneven_inputs = true;
};

class DistributedDataParallel {
 public:
  // Collective over comm. `module` and `optimizer` must outlive this object;
  // the optimizer must hold the module's parameters. A null algorithm is
  // gradient_allreduce (averaging).
  DistributedDataParallel(CommunicatorPtr comm, ::torch::nn::Module& module,
                          ::torch::optim::Optimizer& optimizer, AlgorithmPtr algorithm,
                          DdpOptions options = {});
  // Over create_mpi_communicator() (MPI_COMM_WORLD); a null algorithm is
  // gradient_allreduce (averaging).
  DistributedDataParallel(::torch::nn::Module& module, ::torch::optim::Optimizer& optimizer,
                          AlgorithmPtr algorithm = nullptr, DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // The optimizer step with the algorithm's hooks, then the buffer broadcast.
  // Call it after backward, where a plain loop calls optimizer.step().
  void step();

  // While the returned guard lives, backward passes communicate nothing.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // This rank has no more data (collective with the uneven-input check of
  // the other ranks' next backward, or with their finish()). Throws
  // InvalidArgument when other ranks still have data.
  void finish();

  // Runs `fn` with every rank's parameters and buffers of a floating dtype
  // (float32, float64, float16, bfloat16; frozen parameters included) set to
  // their exact average across ranks, then restores this rank's own values
  // (collective). Integer and bool tensors keep this rank's values; another
  // dtype (complex) throws Unsupported before anything is sent. For
  // evaluation under algorithms that leave ranks apart.
  void with_averaged_model(const std::function<void()>& fn);

  void save(const std::string& prefix);
  // Collective; see Checkpoints above.
  void load(const std::string& prefix);

  Algorithm& algorithm();
  const Reducer& reducer() const { return *reducer_; }
  // The Reducer's communicator as of the last synchronized backward.
  const CommunicatorPtr& communicator() const { return comm_; }
  // Optimizer steps taken (resumed checkpoints included).
  int64_t steps() const;

 private:
  class ReadyHook;
  class TorchStep;
  class WithTorchStep;

  // Called by the accumulator post hook of parameter `param`.
  void on_gradient_ready(int param);
  // End of a backward (queued on the autograd engine).
  void end_backward();
  // The uneven-input check: allgather of (steps, has data).
  void check_even(bool has_data);
  bool checks_uneven_inputs() const;
  // After a synchronized backward: comm_ becomes the Reducer's communicator
  // (another one after a view change).
  void follow_view();
  // The communicator of the checks and checkpoint agreements, split from
  // comm_ when first needed after a view change (collective).
  Communicator& check_comm();
  // param.grad of every parameter points at the memory the Reducer uses.
  void point_gradients();
  void broadcast(const std::vector<::torch::Tensor>& tensors, const std::string& what);
  // qadam (which owns the step): its lr becomes the torch optimizer's.
  void pass_learning_rate();
  std::chrono::milliseconds timeout() const;

  CommunicatorPtr comm_;
  CommunicatorPtr check_comm_;  // the uneven-input check, apart from buckets
  ::torch::nn::Module& module_;
  ::torch::optim::Optimizer& optimizer_;
  DdpOptions options_;
  std::vector<std::string> names_;           // parameters that require gradients
  std::vector<::torch::Tensor> params_;      // same order
  std::vector<::torch::Tensor> grads_;       // the memory param.grad must be
  std::vector<::torch::Tensor> all_params_;  // every parameter, frozen ones too
  std::vector<::torch::Tensor> buffers_;     // every buffer
  std::vector<std::shared_ptr<::torch::autograd::Node>> accumulators_;
  // The user's algorithm, its step numbers moved by a resumed checkpoint's.
  std::shared_ptr<algorithms::StepOffset> algorithm_;
  std::unique_ptr<TorchStep> torch_step_;
  std::unique_ptr<Reducer> reducer_;
  bool no_sync_ = false;
  bool in_backward_ = false;
  bool synced_since_step_ = false;    // a synchronized backward since the last step
  bool backward_since_step_ = false;  // any backward since the last step
};

}  // namespace relaxcc::torch
