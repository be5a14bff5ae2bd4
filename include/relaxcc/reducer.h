// Reducer: buckets and the overlap scheduler that make relaxcc a
// DistributedDataParallel.
//
// During backward, gradients become ready one at a time; mark_ready() (any
// thread) hands each to the Reducer and a complete bucket is handed to the
// Algorithm at once, in bucket order on every rank, so its communication
// overlaps the rest of backward. synchronize() at the end of backward settles
// unused tensors, waits for every bucket with a timeout and rethrows any
// error.
//
// Gradients reach bucket memory in one of two ways:
//   gradient_as_bucket_view  the frontend writes gradients straight into
//                            bucket memory (gradient_view): no copies.
//   copied (the default)     the Reducer's copy thread copies each marked
//                            gradient into its bucket, and copies each
//                            bucket's result back into the gradients as soon
//                            as its communication completed, so neither copy
//                            runs on the thread that runs backward. A
//                            gradient may thus change before synchronize()
//                            returns, once its bucket completed (as with
//                            bucket views); after synchronize() every
//                            gradient holds its result.
//
// Iterations and steps. An iteration is one backward pass, as in PyTorch
// DDP: it starts at begin_step() (or implicitly at the first mark_ready() or
// at synchronize()) and ends when synchronize() returns or throws, no_sync
// iterations included. iteration() counts the iterations that ended, so the
// one in progress is number iteration(), from 0. step() counts optimizer
// steps (optimizer_step() calls): the step algorithms see (StepInfo::step);
// with gradient accumulation several iterations make one step. The rules on
// readiness hold per iteration (each gradient is marked ready at most once),
// and the errors and warnings about them name the iteration.
//
// Unused tensors: a tensor that gets no gradient in an iteration is settled
// by agreement, never by a hang. At synchronize() ranks OR a bitmap of the
// tensors they marked (on a communicator of the Reducer's own, so the
// agreement never interleaves with bucket traffic). A tensor used somewhere
// contributes zeros where it was not used; a tensor unused everywhere is left
// untouched, as in DDP. A tensor marked in a no_sync iteration since the last
// synchronizing one counts as used on that rank even when the synchronizing
// iteration does not mark it: its accumulated gradient is reduced, as DDP's
// locally-used map does. A tensor marked on some ranks but not on others may
// be a gradient a rank forgot to mark (its gradient is then lost): the first
// time that happens to a tensor, ranks exchange who marked it and rank 0
// logs a warning naming the tensor and both sets of ranks, once per tensor
// for the Reducer's lifetime. The agreement runs only in steps whose
// gradients the algorithm combines across ranks
// (Algorithm::reduces_gradients): in a step whose gradients stay on each
// rank (DiLoCo's inner steps, local SGD's local steps, decentralized weight
// rounds) a tensor not marked on this rank is left untouched here (its
// gradient, and its parameter in optimizer_step), as in single-process
// training, and the Reducer runs no collective of its own, so ranks do not
// wait for each other at synchronize() unless the algorithm's own Works do.
// In such a step copied gradients are not copied into buckets or back
// (bucket memory then does not hold the step's gradients; buckets are still
// handed to the algorithm in order as their gradients become ready).
//
// The plan is verified across ranks at construction (PeerMismatch names the
// first tensor that differs, with its name, shape and dtype on both ranks)
// and, with rebuild_after_first_step, rebuilt once from the order in which
// gradients became ready in the first iteration (rank 0's order, broadcast),
// as PyTorch DDP does; on_plan_changed callbacks fire so frontends re-fetch
// bucket views.
//
// Checkpoints: state_dict() keeps the plan (its packing order and bucket
// options) and whether the rebuild after the first step happened;
// load_state_dict() adopts it, collectively, so that algorithm state that
// belongs to bucket layouts (state_dict.h) loads into the plan it was saved
// with and a resumed run packs its buckets, and so reduces, as the run it
// continues. Load the Reducer's state before the algorithm's. The bucket
// tuner's measurements are not kept: a Reducer that tunes goes on tuning
// from its own.
//
// Device tensors. Tensors may be CUDA tensors, all on one device, that of
// the ExecContext, whose stream is the producer stream: the one backward
// computes gradients on (InvalidArgument otherwise). The communicator must
// move that device's memory, as an NCCL communicator does (Unsupported
// otherwise, before any communication). Bucket memory is then device memory,
// and no copy goes through the host: mark_ready(i), called once gradient i's
// computation is enqueued on the producer stream, records an event there
// (the host does not wait for the gradient); the Reducer's copy stream waits
// on that event and copies the gradient into its bucket; the algorithm gets
// the copy stream as AlgorithmContext::exec, so a bucket's collective runs
// after the copies into it while backward goes on. Results are copied back
// on the copy stream, and synchronize() makes the producer stream wait for
// them: work enqueued there afterwards sees every gradient's result (the
// host itself sees them after synchronizing that stream). The Reducer's own
// agreements exchange host values over comm->host_communicator(). The host
// optimizers of optimizer.h refuse device tensors (Unsupported).
//
// Elastic membership (ReducerOptions::elastic, membership.h). An iteration
// whose communication in synchronize() fails because a member was lost
// (PeerLost, or another communication error on a communicator that the loss
// or a survivor's revoke poisoned) is not lost with it: synchronize()
// shrinks the communicator to the survivors (relaxcc::shrink: revoke,
// agreement on the next view, a new UCX communicator), agrees with them
// whether the iteration stands (every member had reached its commit, the
// last collective of an elastic iteration) or runs again, installs the new
// rank 0's plan on new bucket memory, and, to run it again, restores the
// algorithm's state and the unused-tensor bookkeeping as they were when the
// iteration began and reduces the same gradients over the survivors
// (docs/architecture.md, "The elastic Reducer"). Nothing is asked of the
// caller: synchronize() returns as after a healthy iteration (iteration()
// counts the attempts this rank ran). Needs copied gradients on the host
// (results are copied back only after the commit, so a failed attempt
// leaves the gradients as computed), no bucket tuning, and an algorithm whose
// capabilities().survives_view_change (such an algorithm communicates only
// in on_bucket_ready and on_backward_end: a loss during the caller's own
// collectives reaches the caller). A rank left out of the view gets
// Excluded; an iteration that changes views more than
// ElasticOptions::max_view_changes_per_iteration times rethrows its error.
// Costs: a copy of the algorithm's state_dict() at every iteration's start,
// and one 8-byte allreduce (the commit) per iteration.
//
// Newcomers (ElasticOptions::admit): rank 0 looks for processes waiting in
// join() (membership.h) at most every admission_interval and says so in the
// commit; at the end of that step's optimizer_step() the members grow the
// view (relaxcc::grow) and, over the new communicator, hand the newcomers
// rank 0's plan (verified: PeerMismatch) and the training state in shares
// from every member (relaxcc::sync_state: ElasticOptions::save_state's bytes,
// the algorithm's replicated_state_dict(), the step), which each newcomer
// checks against the agreed hash and loads (load_state); a member whose
// state differed from the others' loads it too. A newcomer constructs its
// Reducer on join()'s communicator and view with ElasticOptions::newcomer:
// that construction is its half of the admission, after which it runs the
// next step with the members. A loss during the admission poisons the new
// communicator and the next iteration changes the view.
//
// Errors of the Reducer's own collectives (plan agreement, bucket memory,
// unused tensors, tuning, rebuild) and of the waits on bucket and algorithm
// Works keep their type and name what they were for: their OpOptions::label
// ("Reducer: agreement on unused tensors of iteration 3") is in front of, or
// inside, the message.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "relaxcc/algorithm.h"
#include "relaxcc/bucket_tuner.h"
#include "relaxcc/membership.h"

namespace relaxcc {

namespace buckets {
class BucketMemory;
}  // namespace buckets

struct ReducerOptions {
  BucketPlanOptions plan;
  // The automatic bucketing optimizer (bucket_tuner.h): tunes plan.cap_bytes
  // from measured step times (begin_step to begin_step) during the first
  // steps. Ignored for algorithms whose math depends on bucket boundaries.
  bool auto_tune_buckets = false;
  bool gradient_as_bucket_view = false;
  bool rebuild_after_first_step = true;
  std::chrono::milliseconds timeout{-1};  // negative: RELAXCC_TIMEOUT_MS
  // Set: the Reducer goes on without lost members (see above).
  std::optional<ElasticOptions> elastic;
};

class Reducer {
 public:
  // Collective over comm. Throws PeerMismatch when ranks registered different
  // tensors. Fails together (relaxcc/collective_setup.h): this rank's checks
  // of its tensors, then the plan, its verification and the algorithm's
  // init, each end in an agreement on every rank's outcome, so a rank that
  // fails (an f64 tensor, an algorithm that refuses its context) fails every
  // rank at once, the others throwing its error's type and naming it; where
  // the others wait in a collective that rank never joined, it poisons comm
  // after a 0.5 s grace and they fail with CommunicatorPoisoned naming it. An
  // error on one rank alone in the plan rebuild or load_state_dict poisons
  // comm at once.
  Reducer(CommunicatorPtr comm, std::vector<TensorSpec> tensors, AlgorithmPtr algorithm,
          const ExecContext& exec, ReducerOptions options = {},
          Tunables tunables = Tunables::from_env());
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Starts an iteration: resets readiness and calls
  // Algorithm::on_step_begin. Throws InvalidArgument inside an iteration
  // that synchronize() has not ended.
  void begin_step();
  // Tensor `index` (registration order) has its gradient. Throws
  // InvalidArgument for an unknown tensor or one marked twice in an
  // iteration.
  // With copied gradients a failure to dispatch a bucket is raised by
  // synchronize(); with bucket views, by the mark_ready that completed it.
  void mark_ready(int index);
  void mark_ready(const std::string& name);
  // End of backward and of the iteration; see above. Throws what the
  // communication threw.
  void synchronize();
  // Gradient accumulation: while set, iterations communicate nothing.
  void set_no_sync(bool no_sync);
  // The optimizer step and its hooks: `optimizer` updates each gradient's
  // partner parameter (TensorSpec::partner) from the reduced gradient,
  // unless the algorithm owns the step.
  void optimizer_step(Optimizer& optimizer);

  // With gradient_as_bucket_view: the bucket memory that is tensor
  // `index`'s gradient (re-fetch after a plan change).
  TensorView gradient_view(int index) const;
  void on_plan_changed(std::function<void()> callback);
  const BucketPlan& plan() const { return plan_; }
  // The plan, for a checkpoint (see above): entries "reducer/...".
  StateDict state_dict() const;
  // Collective, between iterations: every rank adopts the plan of its
  // `state`. First the ranks agree: when any rank's state is malformed, of
  // other tensors (names, dtypes, sizes) or given inside an iteration, or
  // the ranks' plans differ, every rank throws InvalidArgument (naming the
  // ranks; a failing rank's own error says why) and keeps its plan.
  // Otherwise a plan other than the one in use is installed as a rebuild
  // installs one (gradients carry over, the algorithm's init runs again,
  // on_plan_changed callbacks fire), and the rebuild after the first step
  // counts as done or not as in the saved Reducer.
  void load_state_dict(const StateDict& state);
  uint64_t plan_version() const { return plan_version_; }
  // Optimizer steps completed (see above).
  int64_t step() const { return step_; }
  // Iterations (backward passes) ended (see above).
  int64_t iteration() const;
  Algorithm& algorithm() { return *algorithm_; }
  // The communicator the buckets use now: another one after a view change.
  CommunicatorPtr communicator() const;
  // The view it runs on (elastic), else epoch 0 of every rank.
  MembershipView view() const;
  // Seconds since construction at which each bucket of the last step was
  // handed to the algorithm (for overlap measurements and tests).
  const std::vector<double>& dispatch_times() const { return dispatch_times_; }
  // The tuner, while or after it tunes (null when not enabled).
  const BucketTuner* tuner() const { return tuner_.get(); }

 private:
  // Starts a step; `implicit` (mark_ready, synchronize) is a no-op inside one.
  void start_step(bool implicit);
  // One iteration's synchronize(); ends the iteration however it leaves.
  void synchronize_iteration();
  // Ends the iteration in progress (restores what the buckets wrote over).
  void end_iteration();
  // Elastic, after a PeerLost in an iteration: shrinks comm_ to the
  // survivors, agrees with them whether the iteration stands (true: its
  // results are copied out) or runs again (its algorithm state is restored),
  // and installs the new rank 0's plan and the algorithm on the new
  // communicator.
  bool change_view();
  // Elastic, at the end of the optimizer_step() whose iteration's commit
  // found newcomers waiting: grows the view and runs the members' half of
  // admission_exchange on the new communicator. A loss meanwhile poisons it
  // (the next iteration changes the view).
  void admit_newcomers();
  // Collective over the new view, members and newcomers: rank 0's plan,
  // installed and verified, then sync_state of the training state, which a
  // newcomer (or a member whose state differed) loads; then the algorithm's
  // init on the new communicator.
  void admission_exchange(bool newcomer);
  // Collective over side_: rank 0's plan order and whether its rebuild after
  // the first step happened (a view change's survivors, a newcomer).
  std::pair<std::vector<int>, bool> rank0_plan(const std::string& label);
  // Elastic: the last collective of an iteration; then its buckets are
  // copied out.
  void commit(const std::string& of_iteration);
  // Elastic: whether an iteration's failure comes from a lost member (a
  // PeerLost, or another communication error on a communicator that a loss
  // or a survivor's revoke poisoned; not Excluded, Timeout or PeerMismatch).
  bool lost_a_member(const CommunicationError& e) const;
  // Elastic, when an iteration begins: what an iteration that runs again
  // restores.
  void save_iteration_start();
  void install_plan(BucketPlan plan);
  // Bucket memory for `plan`: one arena from comm_->allocate (node-shared on
  // one node, so allreduce reads the neighbour's bucket in place), or
  // ordinary memory on every rank if any rank could not get it. Collective.
  std::vector<TensorView> allocate_buckets(const BucketPlan& plan);
  void verify_plan_across_ranks();
  // Submits one of the Reducer's own collectives (`submit` is given the
  // label for its options) and waits for it with the Reducer's timeout. A
  // failure is rethrown as the same type, with `label` in front when its
  // message does not already name it.
  void run_labeled(const std::string& label,
                   const std::function<WorkPtr(const std::string&)>& submit);
  void dispatch_ready_buckets_locked();
  // Collective: the unused-tensor agreement, and the once-per-tensor warning
  // about tensors marked on some ranks only.
  void settle_unused();
  // Collective, given the agreed flags of settle_unused (this rank's marks
  // in `local`): rank 0 warns about each tensor that is marked on some ranks
  // but not on others for the first time.
  void warn_partly_marked(const std::vector<uint8_t>& agreed, const std::vector<uint8_t>& local,
                          int64_t iteration);
  void rebuild_from_ready_order();
  void tune_at_step_boundary();
  void copy_out(int bucket);
  // The copy thread (copied gradients only) and its hand-offs, under mutex_.
  void copier_loop();
  // Copies the oldest marked gradient into its bucket and dispatches the
  // buckets that became complete.
  void copy_in_next(std::unique_lock<std::mutex>& lock);
  // Copies out the buckets whose communication completed, in order, while
  // the next one is done; returns when it reaches one still running.
  void copy_out_completed(std::unique_lock<std::mutex>& lock);
  // No marked gradient waits for its copy and no copy is running (mutex_ held).
  bool copier_idle() const { return copy_in_queue_.empty() && copies_running_ == 0; }
  // Waits until copier_idle(), with the Reducer's timeout.
  void wait_copier_idle(std::unique_lock<std::mutex>& lock);
  std::chrono::milliseconds timeout() const;

  CommunicatorPtr comm_;
  CommunicatorPtr side_;  // agreement traffic, never interleaved with buckets
  // Elastic: the view comm_ runs on, iterations committed, and how far the
  // iteration in progress got (stage_ under mutex_: the copy thread reads it).
  MembershipView view_;
  // What an iteration that runs again restores (save_iteration_start).
  struct IterationStart {
    StateDict algorithm;
    std::vector<char> accumulated, used_in_step, warned;
  } iteration_start_;
  int64_t committed_ = 0;
  // Elastic with admit: a commit saw newcomers waiting (admitted at the end
  // of the step's optimizer_step); rank 0's latest look at the store.
  bool admission_due_ = false;
  std::chrono::steady_clock::time_point last_admission_check_{};
  enum class Stage : int8_t { reducing, committing, committed };
  Stage stage_ = Stage::reducing;
  std::vector<TensorSpec> tensors_;
  AlgorithmPtr algorithm_;
  ExecContext exec_;
  // Bucket memory and the copies into and out of it, for the tensors'
  // device (src/buckets/bucket_memory.h).
  std::unique_ptr<buckets::BucketMemory> memory_;
  ReducerOptions options_;
  Tunables tunables_;
  AlgorithmContext context_;

  BucketPlan plan_;
  uint64_t plan_version_ = 0;
  std::vector<TensorView> storage_;  // one view per bucket, into one arena
  std::vector<int> pending_;         // tensors still to mark, per bucket
  std::vector<WorkPtr> works_;
  int next_dispatch_ = 0;
  std::vector<char> marked_;
  std::vector<int> ready_order_;
  std::vector<std::function<void()>> plan_callbacks_;
  std::vector<double> dispatch_times_;
  std::vector<char> untouched_;  // unused on every rank in this iteration
  // Marked in a no_sync iteration since the last iteration that synchronized:
  // such a gradient counts as used there (its accumulation is reduced).
  std::vector<char> accumulated_;
  // Used on some rank in a synchronizing iteration since the last optimizer
  // step: the gradients the optimizer updates from.
  std::vector<char> used_in_step_;
  // Bucket views: the values of tensors unused on every rank, restored when
  // the iteration ends (the bucket operation writes over them). Not with an
  // algorithm that owns the optimizer step: it reads the bucket (zeros).
  std::vector<std::pair<int, std::vector<unsigned char>>> kept_;
  std::vector<char> warned_;         // partly marked, warned about (same on every rank)
  std::vector<WorkPtr> step_works_;  // from on_step_begin
  std::chrono::steady_clock::time_point created_;
  std::unique_ptr<BucketTuner> tuner_;
  std::chrono::steady_clock::time_point last_begin_{};

  mutable std::mutex mutex_;
  std::mutex start_mutex_;
  int64_t step_ = 0;       // optimizer steps
  int64_t iteration_ = 0;  // iterations ended (under mutex_)
  bool in_step_ = false;   // an iteration is in progress
  // The iteration's step combines no gradients (Algorithm::reduces_gradients
  // false): no agreement, and no copies into or out of buckets. Set at the
  // start of an iteration, while the copy thread is idle.
  bool local_step_ = false;
  bool no_sync_ = false;
  bool rebuilt_ = false;

  // Moves (and wakes the copy thread) on every event it waits for: a marked
  // gradient, a bucket's completion (a Work callback, on the engine thread),
  // stop. Shared with those callbacks, which may outlive the Reducer.
  std::shared_ptr<std::atomic<uint64_t>> copier_wake_ = std::make_shared<std::atomic<uint64_t>>(0);
  std::condition_variable copier_idle_cv_;  // a copy finished
  std::deque<int> copy_in_queue_;           // marked tensors not yet in their bucket
  int copies_running_ = 0;                  // batches or buckets being copied
  int next_copy_out_ = 0;                   // first bucket not yet copied back
  bool copier_stop_ = false;
  std::exception_ptr copier_error_;  // from a dispatch on the copy thread
  std::thread copier_;
};

}  // namespace relaxcc
