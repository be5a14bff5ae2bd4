#include "relaxcc/reducer.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <set>
#include <utility>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "relaxcc/logging.h"

namespace relaxcc {

namespace {

char* slot_ptr(const TensorView& storage, const BucketEntry& e, DType dtype) {
  return static_cast<char*>(storage.data) + e.offset * static_cast<int64_t>(dtype_size(dtype));
}

void wake_copier(std::atomic<uint64_t>& wake) {
  wake.fetch_add(1);
  wake.notify_all();
}

// Waits for every Work and rethrows the first failure.
void wait_all(std::vector<WorkPtr>& works, std::chrono::milliseconds timeout) {
  std::exception_ptr first;
  for (auto& w : works) {
    if (!w) continue;
    try {
      w->wait(timeout);
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
  RELAXCC_ENFORCE(comm_ != nullptr && algorithm_ != nullptr, InvalidArgument, "Reducer: null communicator or algorithm");
  std::set<std::string> names;
  int64_t flat = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorSpec& t = tensors_[i];
    t.view.check_valid(t.name.c_str());
    RELAXCC_ENFORCE(t.view.device.is_host(), Unsupported, "Reducer: tensor '", t.name, "' on ", t.view.device,
                    ": host tensors (device tensors come with the NCCL path)");
    RELAXCC_ENFORCE(names.insert(t.name).second, InvalidArgument, "Reducer: tensor name '", t.name, "' registered twice");
    RELAXCC_ENFORCE(t.partner < static_cast<int>(tensors_.size()), InvalidArgument, "Reducer: tensor '", t.name,
                    "' has partner ", t.partner, " of ", tensors_.size());
    context_.flat_offset.push_back(flat);
    flat += t.view.numel;
  }
  side_ = comm_->split(0, comm_->rank());
  context_.comm = comm_;
  context_.tensors = &tensors_;
  context_.tunables = tunables_;
  context_.exec = exec_;
  install_plan(BucketPlan::build(tensors_, {}, options_.plan));
  verify_plan_across_ranks();
  algorithm_->init(context_);
  if (options_.auto_tune_buckets) {
    if (algorithm_->capabilities().depends_on_bucket_boundaries) {
      RELAXCC_LOG(info, "Reducer: ", algorithm_->name(), " depends on bucket boundaries: no bucket tuning");
    } else {
      int64_t total = 0;
      for (const TensorSpec& t : tensors_)
        if (t.role == TensorRole::gradient) total += static_cast<int64_t>(t.view.nbytes());
      tuner_ = std::make_unique<BucketTuner>(BucketTunerOptions{5, std::max<int64_t>(total, 1)});
      options_.plan.cap_bytes = tuner_->current_cap();
      options_.plan.first_cap_bytes = std::min(options_.plan.first_cap_bytes, options_.plan.cap_bytes);
      install_plan(BucketPlan::build(tensors_, plan_.order(), options_.plan));
      algorithm_->init(context_);
    }
  }
  if (!options_.gradient_as_bucket_view) copier_ = std::thread([this] { copier_loop(); });
}

void Reducer::tune_at_step_boundary() {
  const auto now = std::chrono::steady_clock::now();
  const bool first = last_begin_ == std::chrono::steady_clock::time_point{};
  const double local = std::chrono::duration<double>(now - last_begin_).count();
  last_begin_ = now;
  if (first) return;
  double step_seconds = local;  // the slowest rank's step
  AllreduceOptions o;
  o.op = ReduceOp::max;
  side_->allreduce(TensorView::host(&step_seconds, 1), ExecContext::host(), o)->wait(timeout());
  if (!tuner_->record(step_seconds)) return;
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
}

std::chrono::milliseconds Reducer::timeout() const {
  return options_.timeout.count() >= 0 ? options_.timeout : std::chrono::milliseconds(tunables_.timeout_ms);
}

std::vector<TensorView> Reducer::allocate_buckets(const BucketPlan& plan) {
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const Bucket& bucket : plan.buckets()) {
    offsets.push_back(total);
    total += (bucket.numel * static_cast<int64_t>(dtype_size(bucket.dtype)) + 63) / 64 * 64;
  }
  TensorView arena;
  int32_t shared_ok = 1;
  try {
    arena = comm_->allocate(total, DType::u8);
  } catch (const CommunicationError& e) {
    RELAXCC_LOG(
        warn, "Reducer: no communicator memory for the buckets, every rank uses ordinary memory: ",
        e.what());
    shared_ok = 0;
  }
  AllreduceOptions o;
  o.op = ReduceOp::min;
  side_->allreduce(TensorView::host(&shared_ok, 1), ExecContext::host(), o)->wait(timeout());
  if (!shared_ok) {
    auto memory = std::make_shared<std::vector<unsigned char>>(static_cast<size_t>(total));
    arena = TensorView(memory->data(), total, DType::u8, Device::host(), memory);
  }
  std::vector<TensorView> buckets;
  for (size_t b = 0; b < offsets.size(); ++b) {
    const Bucket& bucket = plan.buckets()[b];
    buckets.emplace_back(static_cast<unsigned char*>(arena.data) + offsets[b], bucket.numel,
                         bucket.dtype, Device::host(), arena.owner);
  }
  return buckets;
}

void Reducer::install_plan(BucketPlan plan) {
  std::vector<TensorView> storage = allocate_buckets(plan);
  for (size_t b = 0; b < storage.size(); ++b) {
    const Bucket& bucket = plan.buckets()[b];
    for (const BucketEntry& e : bucket.entries) {
      // Gradients carry over: from the old bucket (views) or the tensor.
      const TensorSpec& t = tensors_[e.tensor];
      const void* from = t.view.data;
      if (options_.gradient_as_bucket_view && !storage_.empty()) {
        const auto [ob, oe] = plan_.locate(e.tensor);
        from = slot_ptr(storage_[ob], plan_.buckets()[ob].entries[oe], bucket.dtype);
      }
      if (e.numel > 0) std::memcpy(slot_ptr(storage[b], e, bucket.dtype), from, t.view.nbytes());
    }
  }
  storage_ = std::move(storage);
  plan_ = std::move(plan);
  context_.plan = &plan_;
  pending_.assign(plan_.buckets().size(), 0);
  works_.assign(plan_.buckets().size(), nullptr);
  marked_.assign(tensors_.size(), 0);
  untouched_.assign(tensors_.size(), 0);
}

void Reducer::verify_plan_across_ranks() {
  // Rank 0's description of every tensor; each rank finds its first
  // difference, and the minimum over ranks is raised everywhere.
  const int64_t count = static_cast<int64_t>(tensors_.size());
  int64_t root_count = count;
  side_->broadcast(TensorView::host(&root_count, 1), ExecContext::host())->wait(timeout());
  std::vector<int64_t> mine(static_cast<size_t>(count) * 4);
  for (int64_t i = 0; i < count; ++i) {
    const TensorSpec& t = tensors_[i];
    mine[4 * i] = static_cast<int64_t>(Fnv1a().bytes(t.name).value());
    mine[4 * i + 1] = static_cast<int64_t>(t.view.dtype);
    mine[4 * i + 2] = t.view.numel;
    mine[4 * i + 3] = static_cast<int64_t>(t.role);
  }
  std::vector<int64_t> root(static_cast<size_t>(root_count) * 4 + 1);
  if (comm_->rank() == 0) std::copy(mine.begin(), mine.end(), root.begin());
  side_->broadcast(TensorView::host(root.data(), root_count * 4), ExecContext::host())->wait(timeout());
  int64_t first = std::numeric_limits<int64_t>::max();
  for (int64_t i = 0; i < std::max(count, root_count); ++i) {
    if (i >= count || i >= root_count || !std::equal(mine.begin() + 4 * i, mine.begin() + 4 * i + 4, root.begin() + 4 * i)) {
      first = i;
      break;
    }
  }
  int64_t global = first;
  AllreduceOptions o;
  o.op = ReduceOp::min;
  side_->allreduce(TensorView::host(&global, 1), ExecContext::host(), o)->wait(timeout());
  if (global == std::numeric_limits<int64_t>::max()) return;
  const std::string here = global < count ? detail::concat("'", tensors_[global].name, "' (", tensors_[global].view.numel,
                                                           " x ", tensors_[global].view.dtype, ")")
                                          : std::string("no tensor");
  RELAXCC_THROW(PeerMismatch, "Reducer: ranks registered different tensors: the first difference is tensor #", global,
                "; rank ", comm_->rank(), " has ", here, " (", count, " tensors), rank 0 has ", root_count, " tensors");
}

void Reducer::begin_step() { start_step(false); }

void Reducer::start_step(bool implicit) {
  // Serializes starts: mark_ready may start a step from several threads.
  std::lock_guard<std::mutex> start_lock(start_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (in_step_ && implicit) return;
    RELAXCC_ENFORCE(!in_step_, InvalidArgument, "Reducer: begin_step while step ", step_, " is not synchronized");
  }
  if (tuner_ && !tuner_->done() && !no_sync_) tune_at_step_boundary();
  std::lock_guard<std::mutex> lock(mutex_);
  in_step_ = true;
  std::fill(marked_.begin(), marked_.end(), 0);
  std::fill(untouched_.begin(), untouched_.end(), 0);
  for (size_t b = 0; b < plan_.buckets().size(); ++b)
    pending_[b] = static_cast<int>(plan_.buckets()[b].entries.size());
  std::fill(works_.begin(), works_.end(), nullptr);
  next_dispatch_ = 0;
  next_copy_out_ = 0;
  ready_order_.clear();
  dispatch_times_.clear();
  if (!no_sync_) {
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
                  "Reducer: mark_ready of unknown tensor #", index, " (", tensors_.size(), " registered)");
  RELAXCC_ENFORCE(tensors_[index].role == TensorRole::gradient, InvalidArgument, "Reducer: mark_ready of '",
                  tensors_[index].name, "', which is not a gradient");
  start_step(true);
  std::lock_guard<std::mutex> lock(mutex_);
  RELAXCC_ENFORCE(!marked_[index], InvalidArgument, "Reducer: tensor '", tensors_[index].name,
                  "' marked ready twice in step ", step_);
  marked_[index] = 1;
  ready_order_.push_back(index);
  if (no_sync_) return;
  if (!options_.gradient_as_bucket_view) {
    copy_in_queue_.push_back(index);
    wake_copier(*copier_wake_);
    return;
  }
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
  lock.unlock();
  if (bucket.entries[e].numel > 0)
    std::memcpy(slot_ptr(storage_[b], bucket.entries[e], bucket.dtype), tensors_[index].view.data,
                tensors_[index].view.nbytes());
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
    RELAXCC_THROW(InternalError, "Reducer: the copy thread did not finish its copies within ", timeout().count(),
                  " ms");
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

void Reducer::settle_unused() {
  std::vector<uint8_t> used(tensors_.size(), 0);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < tensors_.size(); ++i) used[i] = marked_[i] ? 1 : 0;
  }
  AllreduceOptions o;
  o.op = ReduceOp::max;
  side_->allreduce(TensorView(used.data(), static_cast<int64_t>(used.size()), DType::u8), ExecContext::host(), o)
      ->wait(timeout());
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].role != TensorRole::gradient || marked_[i]) continue;
    // Not used here: contribute zeros; if unused everywhere, leave it alone.
    const auto [b, e] = plan_.locate(static_cast<int>(i));
    const Bucket& bucket = plan_.buckets()[b];
    std::memset(slot_ptr(storage_[b], bucket.entries[e], bucket.dtype), 0, tensors_[i].view.nbytes());
    untouched_[i] = used[i] ? 0 : 1;
    marked_[i] = 1;
    --pending_[b];
  }
  dispatch_ready_buckets_locked();
}

void Reducer::synchronize() {
  start_step(true);  // a step with no gradient at all on this rank starts here
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (no_sync_) {
      in_step_ = false;
      return;
    }
  }
  struct EndStep {
    Reducer* r;
    ~EndStep() {
      std::unique_lock<std::mutex> lock(r->mutex_);
      // A copy still running (after an error) finishes before the step ends.
      r->copier_idle_cv_.wait(lock, [this] { return r->copier_idle(); });
      r->next_copy_out_ = r->next_dispatch_;
      r->in_step_ = false;
    }
  } end_step{this};
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
        wait_all(works, timeout());
      } catch (const std::exception& e) {
        RELAXCC_LOG(warn, "Reducer: after a failed dispatch, a bucket in flight failed too: ", e.what());
      }
      std::rethrow_exception(error);
    }
  }
  settle_unused();
  wait_all(step_works_, timeout());
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
      if (works[b]) works[b]->wait(timeout());
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
  if (WorkPtr w = algorithm_->on_backward_end(StepInfo{step_})) {
    w->wait(timeout());
    for (size_t b = 0; b < works.size(); ++b) copy_out(static_cast<int>(b));  // it may have changed buckets
  }
  if (options_.rebuild_after_first_step && !rebuilt_) rebuild_from_ready_order();
}

void Reducer::copy_out(int b) {
  if (options_.gradient_as_bucket_view) return;
  const Bucket& bucket = plan_.buckets()[b];
  for (const BucketEntry& e : bucket.entries) {
    if (untouched_[e.tensor] || e.numel == 0) continue;
    std::memcpy(tensors_[e.tensor].view.data, slot_ptr(storage_[b], e, bucket.dtype), tensors_[e.tensor].view.nbytes());
  }
}

void Reducer::rebuild_from_ready_order() {
  rebuilt_ = true;
  // Rank 0's ready order; tensors never marked follow in reverse order.
  const int count = static_cast<int>(tensors_.size());
  std::vector<int32_t> order(static_cast<size_t>(count), -1);
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
  side_->broadcast(TensorView::host(order.data(), count), ExecContext::host())->wait(timeout());
  std::vector<int> new_order(order.begin(), order.end());
  BucketPlan next = BucketPlan::build(tensors_, new_order, options_.plan);
  if (next.hash(tensors_) == plan_.hash(tensors_)) return;
  install_plan(std::move(next));
  ++plan_version_;
  algorithm_->init(context_);
  RELAXCC_LOG(info, "Reducer: bucket plan rebuilt from the observed ready order (", plan_.buckets().size(), " buckets)");
  for (auto& cb : plan_callbacks_) cb();
}

void Reducer::set_no_sync(bool no_sync) {
  std::lock_guard<std::mutex> lock(mutex_);
  RELAXCC_ENFORCE(!in_step_, InvalidArgument, "Reducer: set_no_sync inside a step");
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
      if (g.role != TensorRole::gradient || g.partner < 0 || untouched_[i]) continue;
      optimizer.update(tensors_[g.partner].view, gradient_view(static_cast<int>(i)), context_.flat_offset[g.partner]);
    }
  }
  optimizer.finish_step();
  if (WorkPtr w = algorithm_->after_optimizer_step(info)) w->wait(timeout());
  ++step_;
}

TensorView Reducer::gradient_view(int index) const {
  std::lock_guard<std::mutex> lock(mutex_);
  RELAXCC_ENFORCE(index >= 0 && index < static_cast<int>(tensors_.size()), InvalidArgument,
                  "Reducer: gradient_view of unknown tensor #", index);
  if (!options_.gradient_as_bucket_view) return tensors_[index].view;
  const auto [b, e] = plan_.locate(index);
  RELAXCC_ENFORCE(b >= 0, InvalidArgument, "Reducer: tensor '", tensors_[index].name, "' is not in a bucket");
  const Bucket& bucket = plan_.buckets()[b];
  return TensorView(slot_ptr(storage_[b], bucket.entries[e], bucket.dtype), bucket.entries[e].numel,
                    bucket.dtype);
}

void Reducer::on_plan_changed(std::function<void()> callback) { plan_callbacks_.push_back(std::move(callback)); }

}  // namespace relaxcc
