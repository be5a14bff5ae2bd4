#include "relaxcc/reducer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <limits>
#include <set>
#include <utility>

#include "relaxcc/collective_setup.h"
#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "relaxcc/logging.h"
#include "src/buckets/bucket_memory.h"
#include "src/buckets/reducer_internal.h"

namespace relaxcc {

namespace {

void wake_copier(std::atomic<uint64_t>& wake) {
  wake.fetch_add(1);
  wake.notify_all();
}

// Rethrows `e` as its own type with `label` in front of its message, unless
// the message already names the label.
template <typename E>
[[noreturn]] void throw_labeled(const E& e, const std::string& label) {
  if (e.message().find(label) != std::string::npos) throw;
  throw E(detail::concat(label, ": ", e.message()), e.file(), e.line());
}

// Called inside a catch block: rethrows the current exception with `label`
// (throw_labeled) when it is one of relaxcc's errors, unchanged otherwise.
[[noreturn]] void rethrow_labeled(const std::string& label) {
  try {
    throw;
  } catch (const Timeout& e) {
    throw_labeled(e, label);
  } catch (const PeerMismatch& e) {
    throw_labeled(e, label);
  } catch (const CommunicatorPoisoned& e) {
    throw_labeled(e, label);
  } catch (const PeerLost& e) {
    if (e.message().find(label) != std::string::npos) throw;
    throw PeerLost(e.peer(), detail::concat(label, ": ", e.message()), e.file(), e.line());
  } catch (const CommunicationError& e) {
    throw_labeled(e, label);
  } catch (const InvalidArgument& e) {
    throw_labeled(e, label);
  } catch (const Unsupported& e) {
    throw_labeled(e, label);
  } catch (const CorruptPayload& e) {
    throw_labeled(e, label);
  } catch (const InternalError& e) {
    throw_labeled(e, label);
  }
}

// Waits for `work` and rethrows its failure with `label` (rethrow_labeled).
void wait_labeled(const WorkPtr& work, std::chrono::milliseconds timeout,
                  const std::string& label) {
  try {
    work->wait(timeout);
  } catch (...) {
    rethrow_labeled(label);
  }
}

// Waits for every Work and rethrows the first failure, with `label`.
void wait_all(std::vector<WorkPtr>& works, std::chrono::milliseconds timeout,
              const std::string& label) {
  std::exception_ptr first;
  for (auto& w : works) {
    if (!w) continue;
    try {
      wait_labeled(w, timeout, label);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  works.clear();
  if (first) std::rethrow_exception(first);
}

}  // namespace

Reducer::Reducer(CommunicatorPtr comm, std::vector<TensorSpec> tensors, AlgorithmPtr algorithm,
                 const ExecContext& exec, ReducerOptions options, Tunables tunables)
    : comm_(std::move(comm)),
      tensors_(std::move(tensors)),
      algorithm_(std::move(algorithm)),
      exec_(exec),
      options_(options),
      tunables_(std::move(tunables)),
      created_(std::chrono::steady_clock::now()) {
  RELAXCC_ENFORCE(comm_ != nullptr && algorithm_ != nullptr, InvalidArgument,
                  "Reducer: null communicator or algorithm");
  // Failing together (relaxcc/collective_setup.h): this rank's checks, then
  // an agreement on every rank's outcome, so that a rank whose tensors fail
  // fails every rank at once, naming it; the same for the plan and the
  // algorithm's init below. A rank that fails where the others wait in a
  // collective it never joined poisons the communicators, so they fail at
  // once too.
  const CommunicatorPtr host = comm_->host_communicator();
  Device device = Device::host();
  const bool newcomer = options_.elastic && options_.elastic->newcomer;
  const auto checks = [&] {
    std::set<std::string> names;
    int64_t flat = 0;
    // Every tensor on one device: the first one's.
    device = tensors_.empty() ? Device::host() : tensors_.front().view.device;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const TensorSpec& t = tensors_[i];
      t.view.check_valid(t.name.c_str());
      RELAXCC_ENFORCE(t.view.device == device, InvalidArgument, "Reducer: tensor '", t.name,
                      "' is on ", t.view.device, " but tensor '", tensors_.front().name, "' is on ",
                      device, ": every tensor of a Reducer lives on one device");
      RELAXCC_ENFORCE(names.insert(t.name).second, InvalidArgument, "Reducer: tensor name '",
                      t.name, "' registered twice");
      RELAXCC_ENFORCE(t.partner < static_cast<int>(tensors_.size()), InvalidArgument,
                      "Reducer: tensor '", t.name, "' has partner ", t.partner, " of ",
                      tensors_.size());
      context_.flat_offset.push_back(flat);
      flat += t.view.numel;
    }
    if (options_.elastic) {
      const ElasticOptions& e = *options_.elastic;
      RELAXCC_ENFORCE(!options_.gradient_as_bucket_view, InvalidArgument,
                      "Reducer: elastic needs copied gradients (gradient_as_bucket_view off): "
                      "a step run again on a new view starts from the gradients as computed");
      RELAXCC_ENFORCE(algorithm_->capabilities().survives_view_change, Unsupported,
                      "Reducer: elastic with ", algorithm_->name(),
                      ", which does not survive a view change (gradient_allreduce and "
                      "bytegrad without hierarchical, and qadam do)");
      RELAXCC_ENFORCE(e.view_change.store != nullptr, InvalidArgument,
                      "Reducer: elastic without a store (ElasticOptions::view_change.store)");
      RELAXCC_ENFORCE_EQ(e.view.size(), comm_->size(), InvalidArgument,
                         "Reducer: elastic: the view ", e.view.describe(),
                         " and the communicator differ in size");
      RELAXCC_ENFORCE(e.max_view_changes_per_iteration >= 1, InvalidArgument,
                      "Reducer: elastic: max_view_changes_per_iteration is ",
                      e.max_view_changes_per_iteration, " (at least 1)");
      RELAXCC_ENFORCE(!options_.auto_tune_buckets, InvalidArgument,
                      "Reducer: elastic with auto_tune_buckets (survivors that run an "
                      "iteration again would tune from other samples than those that keep it)");
      RELAXCC_ENFORCE(!device.is_cuda(), Unsupported,
                      "Reducer: elastic with device tensors (a view change creates a UCX "
                      "communicator, which moves host memory)");
      RELAXCC_ENFORCE(!(e.admit || e.newcomer) || (e.save_state && e.load_state), InvalidArgument,
                      "Reducer: elastic with admit or newcomer needs save_state and "
                      "load_state (the application's part of the training state)");
      RELAXCC_ENFORCE(e.admission_interval >= std::chrono::milliseconds(0), InvalidArgument,
                      "Reducer: elastic: admission_interval is negative (",
                      e.admission_interval.count(), " ms)");
    }
    if (device.is_cuda()) {
      // Checked before any CUDA call.
      RELAXCC_ENFORCE(exec_.device == device, InvalidArgument, "Reducer: the tensors are on ",
                      device, " but the ExecContext is on ", exec_.device,
                      " (its stream is the one their gradients are computed on)");
      const Device moves = comm_->allocate(0, DType::u8).device;
      RELAXCC_ENFORCE(moves == device, Unsupported, "Reducer: rank ", comm_->rank(),
                      "'s tensors are on ", device, " but its communicator moves memory on ", moves,
                      ": device tensors need a communicator that moves device memory (an NCCL "
                      "communicator, relaxcc/nccl_communicator.h)");
    }
  };
  // A newcomer's members are past their construction: its checks are its
  // own, and a plan that differs from theirs fails the admission's
  // verification.
  if (newcomer)
    poison_on_error({comm_.get()}, checks);
  else
    agree_on_checks(*(host ? host : comm_), "Reducer construction", checks, options_.timeout);
  poison_on_error({comm_.get()}, [&] {
    memory_ = buckets::bucket_memory(exec_, device, tensors_.size());
    // The Reducer's own agreements exchange host values: over the host
    // communicator of a device communicator (NCCL's bootstrap).
    side_ = (host ? host : comm_)->split(0, comm_->rank());
  });
  if (options_.elastic) view_ = options_.elastic->view;
  warned_.assign(tensors_.size(), 0);
  accumulated_.assign(tensors_.size(), 0);
  used_in_step_.assign(tensors_.size(), 0);
  context_.comm = comm_;
  context_.tensors = &tensors_;
  context_.tunables = tunables_;
  context_.exec = memory_->bucket_context();
  if (newcomer) {
    // Its half of the admission: rank 0's plan, verified, then the state. A
    // failure here fails the members' admission at once.
    poison_on_error({comm_.get()}, [&] { admission_exchange(true); });
    copier_ = std::thread([this] { copier_loop(); });
    return;
  }
  // The plan, its verification and the algorithm's init, agreed on as the
  // checks above: an algorithm that refuses its context on every rank (a
  // configuration error) fails every rank alike.
  agree_on_checks(*side_, "Reducer construction",
                  [&] {
                    install_plan(BucketPlan::build(tensors_, {}, options_.plan));
                    verify_plan_across_ranks();
                    algorithm_->init(context_);
                    if (options_.auto_tune_buckets) {
                      if (algorithm_->capabilities().depends_on_bucket_boundaries) {
                        RELAXCC_LOG(info, "Reducer: ", algorithm_->name(),
                                    " depends on bucket boundaries: no bucket tuning");
                      } else {
                        int64_t total = 0;
                        for (const TensorSpec& t : tensors_)
                          if (t.role == TensorRole::gradient)
                            total += static_cast<int64_t>(t.view.nbytes());
                        tuner_ = std::make_unique<BucketTuner>(
                            BucketTunerOptions{5, std::max<int64_t>(total, 1)});
                        options_.plan.cap_bytes = tuner_->current_cap();
                        options_.plan.first_cap_bytes =
                            std::min(options_.plan.first_cap_bytes, options_.plan.cap_bytes);
                        install_plan(BucketPlan::build(tensors_, plan_.order(), options_.plan));
                        algorithm_->init(context_);
                      }
                    }
                  },
                  options_.timeout, {comm_.get()});
  if (!options_.gradient_as_bucket_view) copier_ = std::thread([this] { copier_loop(); });
}

void Reducer::tune_at_step_boundary() {
  const auto now = std::chrono::steady_clock::now();
  const bool first = last_begin_ == std::chrono::steady_clock::time_point{};
  const double local = std::chrono::duration<double>(now - last_begin_).count();
  last_begin_ = now;
  if (first) return;
  // The slowest rank's step. Owned by its view, as every buffer of the
  // Reducer's own collectives: a timed-out collective's parked requests
  // never touch freed memory.
  auto step_seconds = std::make_shared<double>(local);
  int64_t iteration = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    iteration = iteration_;
  }
  run_labeled(
      detail::concat("Reducer: bucket tuning: the slowest step time before iteration ", iteration),
      [&](const std::string& label) {
        AllreduceOptions o;
        o.op = ReduceOp::max;
        o.label = label;
        return side_->allreduce(TensorView::host(step_seconds.get(), 1, step_seconds),
                                ExecContext::host(), o);
      });
  if (!tuner_->record(*step_seconds)) return;
  options_.plan.cap_bytes = tuner_->current_cap();
  options_.plan.first_cap_bytes = std::min(options_.plan.first_cap_bytes, options_.plan.cap_bytes);
  install_plan(BucketPlan::build(tensors_, plan_.order(), options_.plan));
  ++plan_version_;
  algorithm_->init(context_);
  for (auto& cb : plan_callbacks_) cb();
}

Reducer::~Reducer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    copier_stop_ = true;
  }
  wake_copier(*copier_wake_);
  if (copier_.joinable()) copier_.join();
  try {
    algorithm_->shutdown(timeout());
  } catch (const std::exception& e) {
    RELAXCC_LOG(warn, "Reducer: algorithm shutdown failed: ", e.what());
  }
  try {
    memory_->finish();  // no copy still reads or writes bucket memory
  } catch (const std::exception& e) {
    RELAXCC_LOG(warn, "Reducer: waiting for the bucket copies failed: ", e.what());
  }
}

std::chrono::milliseconds Reducer::timeout() const {
  return options_.timeout.count() >= 0 ? options_.timeout
                                       : std::chrono::milliseconds(tunables_.timeout_ms);
}

std::vector<TensorView> Reducer::allocate_buckets(const BucketPlan& plan) {
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const Bucket& bucket : plan.buckets()) {
    offsets.push_back(total);
    total += (bucket.numel * static_cast<int64_t>(dtype_size(bucket.dtype)) + 63) / 64 * 64;
  }
  TensorView arena;
  auto shared_ok = std::make_shared<int32_t>(1);
  try {
    arena = comm_->allocate(total, DType::u8);
  } catch (const CommunicationError& e) {
    RELAXCC_LOG(
        warn, "Reducer: no communicator memory for the buckets, every rank uses ordinary memory: ",
        e.what());
    *shared_ok = 0;
  }
  run_labeled("Reducer: agreement on bucket memory (node-shared or ordinary)",
              [&](const std::string& label) {
                AllreduceOptions o;
                o.op = ReduceOp::min;
                o.label = label;
                return side_->allreduce(TensorView::host(shared_ok.get(), 1, shared_ok),
                                        ExecContext::host(), o);
              });
  if (!*shared_ok) arena = memory_->allocate(total);
  std::vector<TensorView> buckets;
  for (size_t b = 0; b < offsets.size(); ++b) {
    const Bucket& bucket = plan.buckets()[b];
    buckets.emplace_back(static_cast<unsigned char*>(arena.data) + offsets[b], bucket.numel,
                         bucket.dtype, arena.device, arena.owner);
  }
  return buckets;
}

void Reducer::install_plan(BucketPlan plan) {
  std::vector<TensorView> storage = allocate_buckets(plan);
  memory_->acquire();  // the gradients as computed so far
  for (size_t b = 0; b < storage.size(); ++b) {
    const Bucket& bucket = plan.buckets()[b];
    for (const BucketEntry& e : bucket.entries) {
      // Gradients carry over: from the old bucket (views) or the tensor.
      const TensorSpec& t = tensors_[e.tensor];
      const void* from = t.view.data;
      if (options_.gradient_as_bucket_view && !storage_.empty()) {
        const auto [ob, oe] = plan_.locate(e.tensor);
        from = detail::slot_ptr(storage_[ob], plan_.buckets()[ob].entries[oe], bucket.dtype);
      }
      if (e.numel > 0)
        memory_->copy(detail::slot_ptr(storage[b], e, bucket.dtype), from, t.view.nbytes());
    }
  }
  memory_->finish();  // the old buckets are released below
  storage_ = std::move(storage);
  plan_ = std::move(plan);
  context_.plan = &plan_;
  pending_.assign(plan_.buckets().size(), 0);
  works_.assign(plan_.buckets().size(), nullptr);
  marked_.assign(tensors_.size(), 0);
  untouched_.assign(tensors_.size(), 0);
}

void Reducer::run_labeled(const std::string& label,
                          const std::function<WorkPtr(const std::string&)>& submit) {
  WorkPtr work;
  try {
    work = submit(label);  // throws CommunicatorPoisoned on a poisoned communicator
  } catch (...) {
    rethrow_labeled(label);
  }
  wait_labeled(work, timeout(), label);
}

void Reducer::begin_step() {
  start_step(false);
}

void Reducer::start_step(bool implicit) {
  // Serializes starts: mark_ready may start a step from several threads.
  std::lock_guard<std::mutex> start_lock(start_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (in_step_ && implicit) return;
    if (in_step_)
      RELAXCC_THROW(InvalidArgument, "Reducer: begin_step inside iteration ", iteration_,
                    ", which synchronize() has not ended (iterations count backward passes since "
                    "construction, "
                    "from 0)");
    stage_ = Stage::reducing;
  }
  if (tuner_ && !tuner_->done() && !no_sync_) tune_at_step_boundary();
  std::lock_guard<std::mutex> lock(mutex_);
  in_step_ = true;
  local_step_ = !algorithm_->reduces_gradients(StepInfo{step_});
  std::fill(marked_.begin(), marked_.end(), 0);
  std::fill(untouched_.begin(), untouched_.end(), 0);
  kept_.clear();
  for (size_t b = 0; b < plan_.buckets().size(); ++b)
    pending_[b] = static_cast<int>(plan_.buckets()[b].entries.size());
  std::fill(works_.begin(), works_.end(), nullptr);
  next_dispatch_ = 0;
  next_copy_out_ = 0;
  ready_order_.clear();
  dispatch_times_.clear();
  if (!no_sync_) {
    if (options_.elastic) save_iteration_start();
    if (WorkPtr w = algorithm_->on_step_begin(StepInfo{step_})) step_works_.push_back(std::move(w));
    dispatch_ready_buckets_locked();  // empty buckets
  }
}

void Reducer::mark_ready(const std::string& name) {
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].name == name) return mark_ready(static_cast<int>(i));
  RELAXCC_THROW(InvalidArgument, "Reducer: mark_ready of unknown tensor '", name, "'");
}

void Reducer::mark_ready(int index) {
  RELAXCC_ENFORCE(index >= 0 && index < static_cast<int>(tensors_.size()), InvalidArgument,
                  "Reducer: mark_ready of unknown tensor #", index, " (", tensors_.size(),
                  " registered)");
  RELAXCC_ENFORCE(tensors_[index].role == TensorRole::gradient, InvalidArgument,
                  "Reducer: mark_ready of '", tensors_[index].name, "', which is not a gradient");
  start_step(true);
  std::lock_guard<std::mutex> lock(mutex_);
  if (marked_[index])
    RELAXCC_THROW(InvalidArgument, "Reducer: tensor '", tensors_[index].name,
                  "' marked ready twice in iteration ", iteration_,
                  " (iterations count backward passes since construction, from 0, each ended by "
                  "synchronize(); optimizer steps so far: ",
                  step_, ")");
  marked_[index] = 1;
  ready_order_.push_back(index);
  if (no_sync_) {
    accumulated_[index] = 1;
    return;
  }
  // The gradient is enqueued on the producer stream (device: an event there,
  // no host wait; host: nothing to record).
  memory_->record_ready(index);
  if (!options_.gradient_as_bucket_view) {
    copy_in_queue_.push_back(index);
    wake_copier(*copier_wake_);
    return;
  }
  memory_->await_ready(index);  // the bucket's operation runs after it
  --pending_[plan_.locate(index).first];
  dispatch_ready_buckets_locked();
}

void Reducer::copier_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!copier_stop_) {
    if (!copy_in_queue_.empty()) {
      copy_in_next(lock);
      continue;
    }
    // Read before looking: whatever happens after it (a marked gradient, a
    // bucket's completion callback, stop) moves the counter, so the wait
    // below returns at once.
    const uint64_t seen = copier_wake_->load();
    copy_out_completed(lock);
    if (copier_stop_ || !copy_in_queue_.empty()) continue;
    lock.unlock();
    copier_wake_->wait(seen);
    lock.lock();
  }
}

void Reducer::copy_in_next(std::unique_lock<std::mutex>& lock) {
  const int index = copy_in_queue_.front();
  copy_in_queue_.pop_front();
  ++copies_running_;
  // The plan and bucket memory change only between steps, when this thread
  // is idle; each gradient is marked once, so nobody else writes its slot.
  const auto [b, e] = plan_.locate(index);
  const Bucket& bucket = plan_.buckets()[b];
  const bool copy = bucket.entries[e].numel > 0 && !local_step_;
  lock.unlock();
  if (copy)
    memory_->copy_in(index, detail::slot_ptr(storage_[b], bucket.entries[e], bucket.dtype),
                     tensors_[index].view.data, tensors_[index].view.nbytes());
  lock.lock();
  --copies_running_;
  --pending_[b];
  try {
    dispatch_ready_buckets_locked();
  } catch (...) {
    if (!copier_error_) copier_error_ = std::current_exception();
  }
  copier_idle_cv_.notify_all();
}

void Reducer::copy_out_completed(std::unique_lock<std::mutex>& lock) {
  // Elastic: the gradients stay as computed until the iteration committed,
  // for an iteration that runs again on a new view.
  if (options_.elastic && stage_ != Stage::committed) return;
  while (next_copy_out_ < next_dispatch_) {
    const WorkPtr& w = works_[next_copy_out_];
    if (w && (!w->is_completed() || w->exception())) return;
    const int b = next_copy_out_++;
    ++copies_running_;
    lock.unlock();
    copy_out(b);
    lock.lock();
    --copies_running_;
    copier_idle_cv_.notify_all();
  }
}

void Reducer::wait_copier_idle(std::unique_lock<std::mutex>& lock) {
  // Local copies only: bounded, but waited for with the Reducer's timeout.
  if (!copier_idle_cv_.wait_for(lock, timeout(), [this] { return copier_idle(); }))
    RELAXCC_THROW(InternalError, "Reducer: the copy thread did not finish its copies within ",
                  timeout().count(), " ms");
}

void Reducer::dispatch_ready_buckets_locked() {
  const int nb = static_cast<int>(plan_.buckets().size());
  while (next_dispatch_ < nb && pending_[next_dispatch_] == 0) {
    const TensorView& data = storage_[next_dispatch_];
    WorkPtr& work = works_[next_dispatch_];
    work = algorithm_->on_bucket_ready(StepInfo{step_}, next_dispatch_, data);
    // The copy thread copies the bucket back once it completed.
    if (work && !options_.gradient_as_bucket_view)
      work->then([wake = copier_wake_](const Work&) { wake_copier(*wake); });
    dispatch_times_.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - created_).count());
    ++next_dispatch_;
  }
}

void Reducer::synchronize() {
  if (!options_.elastic) return synchronize_iteration();
  int changes = 0;
  std::vector<int> marks;  // the iteration's, in ready order
  for (;;) {
    try {
      if (changes > 0) {
        start_step(false);
        for (int i : marks) mark_ready(i);
      }
      synchronize_iteration();
      return;
    } catch (const CommunicationError& e) {
      if (!lost_a_member(e) || ++changes > options_.elastic->max_view_changes_per_iteration) throw;
      bool open = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        open = in_step_;  // it failed before synchronize_iteration() started
        if (changes == 1) marks = ready_order_;
      }
      if (open) end_iteration();
      RELAXCC_LOG(warn, "Reducer: an iteration of optimizer step ", step_, " failed on ",
                  view_.describe(), " (", e.message(), "): changing the view");
      // A member lost while the view changes (or another survivor's revoke
      // of the new communicator): change it again. shrink's own errors
      // (Excluded, Timeout) reach the caller.
      for (;;) {
        try {
          if (!change_view()) break;
          return;  // the iteration stands
        } catch (const CommunicationError& again) {
          if ((dynamic_cast<const PeerLost*>(&again) == nullptr &&
               dynamic_cast<const CommunicatorPoisoned*>(&again) == nullptr) ||
              ++changes > options_.elastic->max_view_changes_per_iteration)
            throw;
        }
      }
    }
  }
}

bool Reducer::change_view() {
  admission_due_ = false;  // the new view's commits look for newcomers again
  ViewChangeOptions o = options_.elastic->view_change;
  o.lost_ranks.clear();
  // This rank's evidence, as a rank of comm_: the rank its poisoning names
  // (the PeerLost may come from an algorithm's group and name a rank of that
  // group). Without it the agreement waits for the others' reports.
  int peer = -1;
  if (comm_->poisoned()) {
    try {
      comm_->barrier()->wait(std::chrono::milliseconds(0));
    } catch (const PeerLost& named) {
      peer = named.peer();
    } catch (const Error&) {
    }
  }
  if (peer >= 0 && peer < comm_->size() && peer != comm_->rank()) o.lost_ranks.push_back(peer);
  const MembershipView from = view_;
  ViewChangeResult next = shrink(*comm_, view_, o);  // Excluded, Timeout: the caller's
  {
    std::lock_guard<std::mutex> lock(mutex_);
    comm_ = std::move(next.comm);
    view_ = std::move(next.view);
  }
  side_ = comm_->split(0, comm_->rank());
  context_.comm = comm_;
  RELAXCC_LOG(warn, "Reducer: the view changed from ", from.describe(), " to ", view_.describe());

  // Where each survivor stands: iterations committed, and how far it got in
  // the one that failed. A commit completes on a rank only once every
  // member reached it, so a survivor that never reached its commit means
  // that nobody committed that iteration: whoever is at that count runs it
  // again. Otherwise the iteration's results are complete on every survivor
  // at that count, and it stands there (a survivor one count ahead has
  // committed it).
  const int n = comm_->size();
  Stage stage = Stage::reducing;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stage = stage_;
  }
  auto mine = std::make_shared<std::array<int64_t, 2>>(
      std::array<int64_t, 2>{committed_, static_cast<int64_t>(stage)});
  auto all = std::make_shared<std::vector<int64_t>>(2 * static_cast<size_t>(n));
  run_labeled(
      "Reducer: where the survivors stand after the view change", [&](const std::string& label) {
        AllgatherOptions a;
        a.label = label;
        return side_->allgather(TensorView::host(mine->data(), 2, mine),
                                TensorView::host(all->data(), 2 * n, all), ExecContext::host(), a);
      });
  // The plan of the new rank 0, so that every survivor packs alike (one may
  // have rebuilt its plan after a commit that another missed).
  const auto [agreed, rank0_rebuilt] = rank0_plan("Reducer: rank 0's plan after the view change");
  bool unreached = false;  // a survivor at this rank's count never reached the commit
  for (int r = 0; r < n; ++r)
    if ((*all)[2 * r] == committed_ && (*all)[2 * r + 1] == static_cast<int64_t>(Stage::reducing))
      unreached = true;
  const bool stands = stage == Stage::committed || (stage == Stage::committing && !unreached);
  if (stage == Stage::committing && stands) {
    // Its results are complete: committed here too, then copied out of the
    // old buckets.
    ++committed_;
    std::unique_lock<std::mutex> lock(mutex_);
    stage_ = Stage::committed;
    for (size_t b = 0; b < plan_.buckets().size(); ++b) copy_out(static_cast<int>(b));
  }
  if (!stands) {
    // As the iteration began: the algorithm's state (loaded before its plan
    // or communicator changes: the state is of those) and what the
    // unused-tensor agreement keeps.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stage_ = Stage::reducing;
      accumulated_ = iteration_start_.accumulated;
      used_in_step_ = iteration_start_.used_in_step;
      warned_ = iteration_start_.warned;
    }
    algorithm_->load_state_dict(iteration_start_.algorithm);
  }
  rebuilt_ = rank0_rebuilt;
  install_plan(BucketPlan::build(tensors_, agreed, options_.plan));
  ++plan_version_;
  algorithm_->init(context_);
  // A further view change within this iteration restores this state.
  if (!stands) iteration_start_.algorithm = algorithm_->state_dict();
  for (auto& cb : plan_callbacks_) cb();
  return stands;
}

CommunicatorPtr Reducer::communicator() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return comm_;
}

MembershipView Reducer::view() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (options_.elastic) return view_;
  MembershipView all;
  for (int r = 0; r < comm_->size(); ++r) all.members.push_back(r);
  return all;
}

void Reducer::end_iteration() {
  std::unique_lock<std::mutex> lock(mutex_);
  // A copy still running (after an error) finishes before the iteration ends.
  copier_idle_cv_.wait(lock, [this] { return copier_idle(); });
  // Tensors unused everywhere get their values back, however the iteration
  // ended.
  try {
    for (const auto& [i, bytes] : std::exchange(kept_, {})) {
      const auto [b, e] = plan_.locate(i);
      const Bucket& bucket = plan_.buckets()[b];
      memory_->write(detail::slot_ptr(storage_[b], bucket.entries[e], bucket.dtype), bytes);
    }
    // Work enqueued on the producer stream afterwards sees the results.
    memory_->publish();
  } catch (const std::exception& e) {
    RELAXCC_LOG(error, "Reducer: ending the iteration: ", e.what());
  }
  next_copy_out_ = next_dispatch_;
  in_step_ = false;
  ++iteration_;
}

void Reducer::synchronize_iteration() {
  start_step(true);  // an iteration with no gradient at all on this rank starts here
  int64_t iteration = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (no_sync_) {
      in_step_ = false;
      ++iteration_;
      return;
    }
    iteration = iteration_;
  }
  // Ends the iteration however synchronize_iteration() leaves.
  struct EndStep {
    Reducer* r;
    ~EndStep() { r->end_iteration(); }
  } end_step{this};
  const std::string of_iteration = detail::concat(" of iteration ", iteration);
  {
    std::unique_lock<std::mutex> lock(mutex_);
    wait_copier_idle(lock);  // every marked gradient is in its bucket
    if (copier_error_) {
      // A dispatch failed: let the buckets already on the wire finish (they
      // use bucket memory), then report the failure.
      const std::exception_ptr error = std::exchange(copier_error_, nullptr);
      std::vector<WorkPtr> works = works_;
      lock.unlock();
      try {
        wait_all(works, timeout(), "Reducer: buckets in flight" + of_iteration);
      } catch (const std::exception& e) {
        RELAXCC_LOG(warn,
                    "Reducer: after a failed dispatch, a bucket in flight failed too: ", e.what());
      }
      std::rethrow_exception(error);
    }
  }
  settle_unused();
  wait_all(step_works_, timeout(), "Reducer: the algorithm's on_step_begin work" + of_iteration);
  std::vector<WorkPtr> works;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    works = works_;
  }
  // Copied gradients: buckets whose Work completed are copied back in order,
  // by the copy thread or here, while later buckets are still on the wire.
  std::exception_ptr first_error;
  for (size_t b = 0; b < works.size(); ++b) {
    try {
      if (works[b])
        wait_labeled(works[b], timeout(), detail::concat("Reducer: bucket ", b, of_iteration));
      if (!first_error) {
        std::unique_lock<std::mutex> lock(mutex_);
        copy_out_completed(lock);
      }
    } catch (...) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  {
    std::unique_lock<std::mutex> lock(mutex_);
    wait_copier_idle(lock);
  }
  if (first_error) std::rethrow_exception(first_error);
  const WorkPtr end = algorithm_->on_backward_end(StepInfo{step_});
  if (end)
    wait_labeled(end, timeout(), "Reducer: the algorithm's on_backward_end work" + of_iteration);
  if (options_.elastic) {
    commit(of_iteration);  // copies every bucket out
  } else if (end) {
    for (size_t b = 0; b < works.size(); ++b)
      copy_out(static_cast<int>(b));  // it may have changed buckets
  }
  if (options_.rebuild_after_first_step && !rebuilt_) rebuild_from_ready_order();
}

void Reducer::commit(const std::string& of_iteration) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stage_ = Stage::committing;
  }
  // {1, minus the newcomers rank 0 saw waiting}, reduced by min.
  auto flag = std::make_shared<std::array<int32_t, 2>>(std::array<int32_t, 2>{1, 0});
  const ElasticOptions& e = *options_.elastic;
  const auto now = std::chrono::steady_clock::now();
  if (e.admit && comm_->rank() == 0 && now - last_admission_check_ >= e.admission_interval) {
    last_admission_check_ = now;
    // A store that fails here delays the admission, never the commit.
    try {
      (*flag)[1] = -static_cast<int32_t>(
          std::min<int64_t>(pending_joiners(e.view_change), std::numeric_limits<int32_t>::max()));
    } catch (const Error& error) {
      RELAXCC_LOG(warn, "Reducer: cannot look for newcomers: ", error.message());
    }
  }
  run_labeled("Reducer: commit" + of_iteration, [&](const std::string& label) {
    AllreduceOptions o;
    o.op = ReduceOp::min;
    o.label = label;
    return side_->allreduce(TensorView::host(flag->data(), 2, flag), ExecContext::host(), o);
  });
  if ((*flag)[1] < 0) admission_due_ = true;
  ++committed_;
  std::unique_lock<std::mutex> lock(mutex_);
  stage_ = Stage::committed;
  copy_out_completed(lock);
  wait_copier_idle(lock);  // the plan may change next (the rebuild after the first step)
}

bool Reducer::lost_a_member(const CommunicationError& e) const {
  if (dynamic_cast<const PeerLost*>(&e) != nullptr) return true;
  if (dynamic_cast<const Excluded*>(&e) != nullptr || dynamic_cast<const Timeout*>(&e) != nullptr ||
      dynamic_cast<const PeerMismatch*>(&e) != nullptr)
    return false;
  // A notice of another survivor's revoke, a stage after a failed one.
  return comm_->poisoned() || side_->poisoned();
}

void Reducer::save_iteration_start() {
  iteration_start_.algorithm = algorithm_->state_dict();
  iteration_start_.accumulated = accumulated_;
  iteration_start_.used_in_step = used_in_step_;
  iteration_start_.warned = warned_;
}

void Reducer::copy_out(int b) {
  if (options_.gradient_as_bucket_view || local_step_) return;
  const Bucket& bucket = plan_.buckets()[b];
  for (const BucketEntry& e : bucket.entries) {
    if (untouched_[e.tensor] || e.numel == 0) continue;
    memory_->copy(tensors_[e.tensor].view.data, detail::slot_ptr(storage_[b], e, bucket.dtype),
                  tensors_[e.tensor].view.nbytes());
  }
}

void Reducer::rebuild_from_ready_order() {
  rebuilt_ = true;
  // Collective: an error on this rank alone reaches the others at once.
  poison_on_error({comm_.get(), side_.get()}, [&] {
    // Rank 0's ready order; tensors never marked follow in reverse order.
    const int count = static_cast<int>(tensors_.size());
    auto order_buf = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(count), -1);
    std::vector<int32_t>& order = *order_buf;
    {
      std::vector<char> placed(count, 0);
      int k = 0;
      for (int i : ready_order_) {
        order[k++] = i;
        placed[i] = 1;
      }
      for (int i = count - 1; i >= 0; --i)
        if (!placed[i]) order[k++] = i;
    }
    int64_t iteration = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      iteration = iteration_;
    }
    run_labeled(
        detail::concat("Reducer: plan rebuild: rank 0's ready order of iteration ", iteration),
        [&](const std::string& label) {
          BroadcastOptions o;
          o.label = label;
          return side_->broadcast(TensorView::host(order.data(), count, order_buf),
                                  ExecContext::host(), o);
        });
    std::vector<int> new_order(order.begin(), order.end());
    BucketPlan next = BucketPlan::build(tensors_, new_order, options_.plan);
    if (next.hash(tensors_) == plan_.hash(tensors_)) return;
    install_plan(std::move(next));
    ++plan_version_;
    algorithm_->init(context_);
    RELAXCC_LOG(info, "Reducer: bucket plan rebuilt from the observed ready order (",
                plan_.buckets().size(), " buckets)");
    for (auto& cb : plan_callbacks_) cb();
  });
}

namespace {
constexpr const char* kStateTensors = "reducer/tensors";
constexpr const char* kStateOrder = "reducer/plan/order";
constexpr const char* kStateCap = "reducer/plan/cap_bytes";
constexpr const char* kStateFirstCap = "reducer/plan/first_cap_bytes";
constexpr const char* kStateAlignment = "reducer/plan/alignment_bytes";
constexpr const char* kStateHash = "reducer/plan/hash";
constexpr const char* kStateRebuilt = "reducer/rebuilt";
}  // namespace

StateDict Reducer::state_dict() const {
  StateDict state;
  std::lock_guard<std::mutex> lock(mutex_);
  state.put_int(kStateTensors, static_cast<int64_t>(tensors_.size()));
  state.put_ints(kStateOrder, std::vector<int64_t>(plan_.order().begin(), plan_.order().end()));
  state.put_int(kStateCap, options_.plan.cap_bytes);
  state.put_int(kStateFirstCap, options_.plan.first_cap_bytes);
  state.put_int(kStateAlignment, options_.plan.alignment_bytes);
  state.put_int(kStateHash, static_cast<int64_t>(plan_.hash(tensors_)));
  state.put_int(kStateRebuilt, rebuilt_ ? 1 : 0);
  return state;
}

void Reducer::load_state_dict(const StateDict& state) {
  const int rank = comm_->rank(), n = comm_->size();
  // Local: read the plan and build it from this rank's tensors; nothing
  // changes yet.
  std::string error;
  BucketPlan plan;
  BucketPlanOptions plan_options;
  bool rebuilt = false;
  uint64_t hash = 0;
  try {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      RELAXCC_ENFORCE(!in_step_, InvalidArgument, "inside iteration ", iteration_,
                      ", which synchronize() has not ended");
    }
    RELAXCC_ENFORCE_EQ(state.get_int(kStateTensors), static_cast<int64_t>(tensors_.size()),
                       InvalidArgument, "the saved Reducer's tensor count and this one's");
    std::vector<int> order;
    for (int64_t i : state.get_ints(kStateOrder)) {
      RELAXCC_ENFORCE(i >= 0 && i < static_cast<int64_t>(tensors_.size()), InvalidArgument,
                      "the saved packing order names tensor #", i, " of ", tensors_.size());
      order.push_back(static_cast<int>(i));
    }
    plan_options.cap_bytes = state.get_int(kStateCap);
    plan_options.first_cap_bytes = state.get_int(kStateFirstCap);
    plan_options.alignment_bytes = state.get_int(kStateAlignment);
    plan = BucketPlan::build(tensors_, order, plan_options);
    hash = plan.hash(tensors_);
    RELAXCC_ENFORCE(hash == static_cast<uint64_t>(state.get_int(kStateHash)), InvalidArgument,
                    "the saved plan is not one of these tensors (their names, dtypes or sizes "
                    "differ)");
    rebuilt = state.get_int(kStateRebuilt) != 0;
  } catch (const Error& e) {
    error = detail::concat("Reducer: rank ", rank,
                           ": cannot adopt the saved bucket plan: ", e.message());
  }
  // Collective: every rank's (can adopt, plan hash).
  auto mine = std::make_shared<std::array<int64_t, 2>>(
      std::array<int64_t, 2>{error.empty() ? 1 : 0, static_cast<int64_t>(hash)});
  auto all = std::make_shared<std::vector<int64_t>>(2 * static_cast<size_t>(n));
  poison_on_error({comm_.get(), side_.get()}, [&] {
    run_labeled("Reducer: load_state_dict: agreement on the saved plan",
                [&](const std::string& label) {
                  AllgatherOptions o;
                  o.label = label;
                  return side_->allgather(TensorView::host(mine->data(), 2, mine),
                                          TensorView::host(all->data(), 2 * n, all),
                                          ExecContext::host(), o);
                });
  });
  if (!error.empty()) RELAXCC_THROW(InvalidArgument, error);
  // failed[r]: rank r cannot adopt its plan; differs[r]: rank r's plan is
  // not rank 0's.
  std::vector<uint8_t> failed(static_cast<size_t>(n)), differs(static_cast<size_t>(n));
  for (size_t r = 0; r < static_cast<size_t>(n); ++r) {
    failed[r] = (*all)[2 * r] ? 0 : 1;
    differs[r] = (*all)[2 * r + 1] != (*all)[1] ? 1 : 0;
  }
  auto any = [](const std::vector<uint8_t>& v) {
    return std::find(v.begin(), v.end(), 1) != v.end();
  };
  if (any(failed))
    RELAXCC_THROW(InvalidArgument, "Reducer: rank ", rank,
                  ": the saved bucket plan not loaded: ", detail::rank_list(failed, 1),
                  " cannot adopt theirs (their own errors say why)");
  if (any(differs))
    RELAXCC_THROW(InvalidArgument, "Reducer: rank ", rank,
                  ": the saved bucket plan not loaded: the plan of ", detail::rank_list(differs, 1),
                  " differs from rank 0's (states saved by different runs?)");
  options_.plan = plan_options;
  rebuilt_ = rebuilt;
  if (plan.order() == plan_.order() && hash == plan_.hash(tensors_)) return;
  // A failure from here on is this rank's alone: it reaches the others at
  // once (collective_setup.h).
  poison_on_error({comm_.get(), side_.get()}, [&] {
    install_plan(std::move(plan));
    ++plan_version_;
    algorithm_->init(context_);
    for (auto& cb : plan_callbacks_) cb();
  });
}

void Reducer::set_no_sync(bool no_sync) {
  std::lock_guard<std::mutex> lock(mutex_);
  RELAXCC_ENFORCE(
      !in_step_, InvalidArgument,
      "Reducer: set_no_sync inside an iteration (call it before begin_step or after synchronize)");
  no_sync_ = no_sync;
}

void Reducer::optimizer_step(Optimizer& optimizer) {
  const StepInfo info{step_};
  algorithm_->before_optimizer_step(info);
  if (algorithm_->capabilities().owns_optimizer_step) {
    algorithm_->optimizer_step(info, optimizer);
  } else {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const TensorSpec& g = tensors_[i];
      if (g.role != TensorRole::gradient || g.partner < 0 || !used_in_step_[i]) continue;
      optimizer.update(tensors_[g.partner].view, gradient_view(static_cast<int>(i)),
                       context_.flat_offset[g.partner]);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::fill(used_in_step_.begin(), used_in_step_.end(), 0);
  }
  optimizer.finish_step();
  if (WorkPtr w = algorithm_->after_optimizer_step(info))
    wait_labeled(
        w, timeout(),
        detail::concat("Reducer: the algorithm's after_optimizer_step work of step ", step_));
  ++step_;
  if (admission_due_) admit_newcomers();
}

void Reducer::admit_newcomers() {
  admission_due_ = false;
  if (comm_->poisoned() || side_->poisoned()) return;  // the next iteration changes the view
  const MembershipView from = view_;
  const CommunicatorPtr old_comm = comm_, old_side = side_;
  // Excluded (this member's creation failed where the others' succeeded):
  // the caller's. Other errors (comm_ failed before the decision: a member
  // lost, or one that failed in the commit and changes the view) wait for
  // the next iteration's view change.
  ViewChangeResult next;
  try {
    next = grow(*comm_, view_, options_.elastic->view_change);
  } catch (const Excluded&) {
    throw;
  } catch (const CommunicationError& e) {
    RELAXCC_LOG(warn, "Reducer: no admission on ", view_.describe(), " (", e.message(),
                "); the next iteration changes the view");
    comm_->poison(detail::concat("no admission on ", view_.describe(), ": ", e.message()));
    side_->poison(detail::concat("no admission on ", view_.describe(), ": ", e.message()));
    return;
  }
  if (!next.comm) return;  // nobody admitted: the view stays
  {
    std::lock_guard<std::mutex> lock(mutex_);
    comm_ = std::move(next.comm);
    view_ = std::move(next.view);
  }
  RELAXCC_LOG(info, "Reducer: newcomers admitted at step ", step_, ": the view changed from ",
              from.describe(), " to ", view_.describe());
  try {
    side_ = comm_->split(0, comm_->rank());
    admission_exchange(false);
  } catch (const Error& e) {
    // A member or newcomer lost during the admission, or a state that did
    // not load: every communicator this member may still use fails, so
    // that the next iteration fails on every member and changes the view
    // from the new one.
    RELAXCC_LOG(warn, "Reducer: the admission into ", view_.describe(), " failed (", e.message(),
                "); the next iteration changes the view");
    const std::string reason =
        detail::concat("the admission into ", view_.describe(), " failed: ", e.message());
    for (Communicator* c : {comm_.get(), side_.get(), old_comm.get(), old_side.get()})
      c->poison(reason);
  }
}

std::pair<std::vector<int>, bool> Reducer::rank0_plan(const std::string& label) {
  const size_t count = tensors_.size();
  auto order = std::make_shared<std::vector<int32_t>>(count + 1, 0);
  std::copy(plan_.order().begin(), plan_.order().end(), order->begin());  // a newcomer's: none
  order->back() = rebuilt_ ? 1 : 0;
  run_labeled(label, [&](const std::string& l) {
    BroadcastOptions b;
    b.label = l;
    return side_->broadcast(TensorView::host(order->data(), static_cast<int64_t>(count) + 1, order),
                            ExecContext::host(), b);
  });
  return {std::vector<int>(order->begin(), order->end() - 1), order->back() != 0};
}

void Reducer::admission_exchange(bool newcomer) {
  const ElasticOptions& e = *options_.elastic;
  context_.comm = comm_;
  // Rank 0's plan (rank 0 is a member: newcomers take the highest process
  // ranks), installed on the new communicator and verified across ranks.
  const int count = static_cast<int>(tensors_.size());
  const auto [agreed, rank0_rebuilt] = rank0_plan("Reducer: rank 0's plan for the newcomers");
  for (int i : agreed)
    RELAXCC_ENFORCE(i >= 0 && i < count, PeerMismatch, "Reducer: rank 0's plan names tensor #", i,
                    " of ", count);
  rebuilt_ = rank0_rebuilt;
  install_plan(BucketPlan::build(tensors_, agreed, options_.plan));
  verify_plan_across_ranks();
  ++plan_version_;

  // The training state: the application's bytes (their count first, 8
  // bytes), then a StateDict of the Reducer's step and commit count, the
  // warnings given and the algorithm's replicated state.
  std::vector<uint8_t> mine;
  if (!newcomer) {
    StateDict held = algorithm_->replicated_state_dict();
    held.put_ints("reducer/admission/counts", {step_, committed_});
    held.put_ints("reducer/admission/warned", std::vector<int64_t>(warned_.begin(), warned_.end()));
    const std::vector<uint8_t> app = e.save_state();
    const std::vector<std::byte> dict = held.serialize();
    const uint64_t app_bytes = app.size();
    mine.resize(sizeof(app_bytes) + app.size() + dict.size());
    std::memcpy(mine.data(), &app_bytes, sizeof(app_bytes));
    std::memcpy(mine.data() + sizeof(app_bytes), app.data(), app.size());
    std::memcpy(mine.data() + sizeof(app_bytes) + app.size(), dict.data(), dict.size());
  }
  StateSyncOptions so;
  so.timeout = timeout();
  so.label = "Reducer: the training state for the newcomers";
  const StateSyncResult synced = sync_state(*side_, mine, !newcomer, so);
  if (newcomer || synced.state != mine) {
    const std::vector<uint8_t>& got = synced.state;
    uint64_t app_bytes = 0;
    if (got.size() >= sizeof(app_bytes)) std::memcpy(&app_bytes, got.data(), sizeof(app_bytes));
    RELAXCC_ENFORCE(got.size() >= sizeof(app_bytes) && app_bytes <= got.size() - sizeof(app_bytes),
                    CorruptPayload, "Reducer: the training state received (", got.size(),
                    " bytes) does not hold the application's ", app_bytes, " bytes");
    const uint8_t* app = got.data() + sizeof(app_bytes);
    const auto* dict = reinterpret_cast<const std::byte*>(app + app_bytes);
    const StateDict held = StateDict::deserialize(
        std::vector<std::byte>(dict, reinterpret_cast<const std::byte*>(got.data() + got.size())));
    const std::vector<int64_t> counts = held.get_ints("reducer/admission/counts");
    const std::vector<int64_t> warned = held.get_ints("reducer/admission/warned");
    RELAXCC_ENFORCE(counts.size() == 2 && warned.size() == warned_.size(), CorruptPayload,
                    "Reducer: the training state received has ", counts.size(), " counts and ",
                    warned.size(), " warning flags for ", warned_.size(), " tensors");
    if (!newcomer)
      RELAXCC_LOG(warn, "Reducer: rank ", comm_->rank(),
                  "'s training state differed from the other members'; it loads theirs");
    e.load_state(std::vector<uint8_t>(app, app + app_bytes));
    algorithm_->load_replicated_state_dict(held);
    step_ = counts[0];
    committed_ = counts[1];
    std::copy(warned.begin(), warned.end(), warned_.begin());
  }
  algorithm_->init(context_);
  for (auto& cb : plan_callbacks_) cb();
}

int64_t Reducer::iteration() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return iteration_;
}

TensorView Reducer::gradient_view(int index) const {
  std::lock_guard<std::mutex> lock(mutex_);
  RELAXCC_ENFORCE(index >= 0 && index < static_cast<int>(tensors_.size()), InvalidArgument,
                  "Reducer: gradient_view of unknown tensor #", index);
  if (!options_.gradient_as_bucket_view) return tensors_[index].view;
  const auto [b, e] = plan_.locate(index);
  RELAXCC_ENFORCE(b >= 0, InvalidArgument, "Reducer: tensor '", tensors_[index].name,
                  "' is not in a bucket");
  const Bucket& bucket = plan_.buckets()[b];
  return TensorView(detail::slot_ptr(storage_[b], bucket.entries[e], bucket.dtype),
                    bucket.entries[e].numel, bucket.dtype, storage_[b].device);
}

void Reducer::on_plan_changed(std::function<void()> callback) {
  plan_callbacks_.push_back(std::move(callback));
}

}  // namespace relaxcc
