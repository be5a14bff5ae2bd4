#include "src/nccl/nccl_state.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>

#include "relaxcc/errors.h"
#include "relaxcc/logging.h"
#include "src/nccl/device_checks.h"
#include "src/nccl/nccl_types.h"

namespace relaxcc::nccl {

NcclState::~NcclState() {
  // shutdown() ran, except when init() failed (no thread then) or when this
  // runs on the progress thread itself (it was detached).
  if (progress_.joinable()) progress_.detach();
  // Any thread that drops the last reference (an owner's, a Work holder's,
  // the progress thread): its current device is restored afterwards.
  QuietDeviceGuard guard(device_);
  if (comm_) (void)ncclCommAbort(comm_);
  for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
  if (ready_event_) (void)cudaEventDestroy(ready_event_);
  if (barrier_buffer_) (void)cudaFree(barrier_buffer_);
  for (auto& [size_class, blocks] : pool_)
    for (void* b : blocks) (void)ncclMemFree(b);
  if (stream_) (void)cudaStreamDestroy(stream_);
  if (aux_stream_) (void)cudaStreamDestroy(aux_stream_);
}

void NcclState::init(const ncclUniqueId& id) {
  DeviceGuard guard(device_, who_);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns; settle() bounds the wait
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, size_, id, rank_, &config);
  comm_ = comm;
  if (r != ncclSuccess && r != ncclInProgress)
    RELAXCC_THROW(DeviceError, who_, ": ncclCommInitRankConfig (", size_,
                  " ranks): ", ncclGetErrorString(r), " (", ncclGetLastError(comm), ")");
  RELAXCC_ENFORCE(comm_ != nullptr, InternalError, who_,
                  ": ncclCommInitRankConfig returned no communicator");
  settle("ncclCommInitRankConfig", "", Clock::now() + timeout_);
  RELAXCC_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), who_,
                     "cudaStreamCreateWithFlags", "");
  RELAXCC_CUDA_CHECK(cudaStreamCreateWithFlags(&aux_stream_, cudaStreamNonBlocking), who_,
                     "cudaStreamCreateWithFlags", "");
  RELAXCC_CUDA_CHECK(cudaEventCreateWithFlags(&ready_event_, cudaEventDisableTiming), who_,
                     "cudaEventCreateWithFlags", "");
  RELAXCC_CUDA_CHECK(cudaMalloc(&barrier_buffer_, sizeof(int32_t)), who_, "cudaMalloc",
                     "barrier buffer");
  RELAXCC_CUDA_CHECK(cudaMemsetAsync(barrier_buffer_, 0, sizeof(int32_t), aux_stream_), who_,
                     "cudaMemsetAsync", "barrier buffer");
  RELAXCC_CUDA_CHECK(cudaStreamSynchronize(aux_stream_), who_, "cudaStreamSynchronize",
                     "barrier buffer");
  // The thread holds the state until shutdown() stops it.
  progress_ = std::thread([self = shared_from_this()] { self->progress_loop(); });
}

void NcclState::settle(const char* call, const std::string& label, Clock::time_point deadline) {
  // Spins RELAXCC_SPIN_US first: a call in progress is usually ready within
  // microseconds, and a sleep costs tens of them.
  const auto spin_until = Clock::now() + std::chrono::microseconds(tunables_.spin_us);
  const auto max_sleep = std::chrono::microseconds(std::max<int64_t>(tunables_.max_sleep_us, 1));
  auto sleep = std::chrono::microseconds(1);
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess)
      RELAXCC_THROW(DeviceError, subject(who_, call, label),
                    ": ncclCommGetAsyncError: ", ncclGetErrorString(r));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress)
      RELAXCC_THROW(DeviceError, subject(who_, call, label), ": ", ncclGetErrorString(state), " (",
                    ncclGetLastError(comm_), ")");
    if (Clock::now() >= deadline)
      RELAXCC_THROW(Timeout, subject(who_, call, label), ": still in progress after ",
                    timeout_.count(),
                    " ms (a rank that never joined it?); the NCCL communicator is aborted");
    if (Clock::now() < spin_until) {
      sched_yield();
      continue;
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, max_sleep);
  }
}

void NcclState::check_nccl(ncclResult_t r, const char* call, const std::string& label) const {
  if (r == ncclSuccess || r == ncclInProgress) return;
  RELAXCC_THROW(DeviceError, subject(who_, call, label), ": ", ncclGetErrorString(r), " (",
                ncclGetLastError(comm_), ")");
}

void NcclState::throw_if_poisoned(const char* op) const {
  if (!poisoned()) return;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    reason = poison_reason_;
  }
  RELAXCC_THROW(CommunicatorPoisoned, who_, ": ", op, ": this NCCL communicator is poisoned (",
                reason, ")");
}

void NcclState::abort_comm() noexcept {
  std::lock_guard<std::mutex> lock(nccl_mutex_);
  if (!comm_) return;
  const ncclResult_t r = ncclCommAbort(comm_);
  if (r != ncclSuccess) RELAXCC_LOG(warn, who_, ": ncclCommAbort: ", ncclGetErrorString(r));
  comm_ = nullptr;
}

void NcclState::mark_poisoned(const std::string& reason) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!poisoned_.load(std::memory_order_relaxed)) {
      poison_reason_ = reason;  // the first reason stays
      poisoned_.store(true, std::memory_order_release);
    }
    return;
  } catch (...) {
  }
  poisoned_.store(true, std::memory_order_release);
}

void NcclState::poison(const std::string& reason, bool abort,
                       std::exception_ptr pending_error) noexcept {
  mark_poisoned(reason);
  if (abort) abort_comm();
  try {
    if (!pending_error)
      pending_error = std::make_exception_ptr(CommunicatorPoisoned(
          detail::concat(who_, ": this NCCL communicator is poisoned (", reason, ")"), __FILE__,
          __LINE__));
    fail_pending(pending_error);
  } catch (...) {
    RELAXCC_LOG(error, who_, ": cannot fail the pending operations after: ", reason);
  }
}

void NcclState::fail_pending(const std::exception_ptr& error) noexcept {
  std::deque<std::shared_ptr<NcclWork>> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending.swap(pending_);
  }
  for (auto& w : pending) {
    w->complete(error);
    park(std::move(w));
  }
}

void NcclState::park(std::shared_ptr<NcclWork> work) noexcept {
  try {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      parked_.push_back(std::move(work));
    }
    cv_.notify_all();
  } catch (...) {
    RELAXCC_LOG(error, who_, ": cannot park an operation; its buffers are released now");
  }
}

bool NcclState::drain_parked() noexcept {
  std::vector<std::shared_ptr<NcclWork>> parked, done;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    parked.swap(parked_);
  }
  if (parked.empty()) return false;
  std::vector<std::shared_ptr<NcclWork>> still;
  for (auto& w : parked) {
    // Ready, or a CUDA error (the device will not run it any further).
    if (cudaEventQuery(w->event()) == cudaErrorNotReady)
      still.push_back(std::move(w));
    else
      done.push_back(std::move(w));
  }
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    parked_.insert(parked_.end(), std::make_move_iterator(still.begin()),
                   std::make_move_iterator(still.end()));
  } catch (...) {
  }
  const bool dropped = !done.empty();
  done.clear();  // releases their buffers and events here, without mutex_
  return dropped;
}

cudaEvent_t NcclState::take_event() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;  // the caller made device_ current
  RELAXCC_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), who_,
                     "cudaEventCreateWithFlags", "");
  return e;
}

void NcclState::give_event(cudaEvent_t e) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    free_events_.push_back(e);
  } catch (...) {
    (void)cudaEventDestroy(e);
  }
}

void NcclState::poll(NcclWork& work) noexcept {
  const cudaError_t e = cudaEventQuery(work.event());
  if (e == cudaSuccess) {
    work.complete(nullptr);
  } else if (e != cudaErrorNotReady) {
    const std::string message =
        detail::concat(subject(who_, "cudaEventQuery", work.description()), ": ", cuda_message(e));
    try {
      work.complete(std::make_exception_ptr(DeviceError(message, __FILE__, __LINE__)));
    } catch (...) {
    }
    poison(message, true);
  }
}

void NcclState::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(fn));
  }
  cv_.notify_all();
}

void NcclState::count_traffic(int peer, uint64_t sent, uint64_t received) {
  std::lock_guard<std::mutex> lock(mutex_);
  bytes_sent_ += sent;
  bytes_received_ += received;
  sent_to_[static_cast<size_t>(peer)] += sent;
  received_from_[static_cast<size_t>(peer)] += received;
}

CommStats NcclState::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  CommStats s;
  s.bytes_sent = bytes_sent_;
  s.bytes_received = bytes_received_;
  s.sent_to = sent_to_;
  s.received_from = received_from_;
  s.operations = operations_;
  s.requests_pending = static_cast<int64_t>(pending_.size() + parked_.size());
  return s;
}

WorkPtr NcclState::enqueue(const char* op, const char* call, const OpOptions& options,
                           const ExecContext* ctx, std::vector<TensorView> keep,
                           const std::string& detail,
                           const std::function<void(ncclComm_t, cudaStream_t)>& issue) {
  throw_if_poisoned(op);
  const uint64_t seq = sequence_.fetch_add(1) + 1;
  std::string description = detail::concat(op, " #", seq, " (nccl", detail.empty() ? "" : ", ",
                                           detail, options.label.empty() ? "" : ", '",
                                           options.label, options.label.empty() ? "" : "'", ")");
  std::shared_ptr<NcclWork> after;
  if (options.after) {
    after = std::dynamic_pointer_cast<NcclWork>(options.after);
    RELAXCC_ENFORCE(after || options.after->is_completed(), Unsupported, who_, ": ", description,
                    ": OpOptions::after must be a Work of an NCCL communicator or a completed "
                    "Work (",
                    options.after->description(), " is pending)");
    if (options.after->is_completed()) {
      if (std::exception_ptr e = options.after->exception()) {
        auto failed = std::make_shared<Work>(description);
        failed->complete(std::make_exception_ptr(CommunicationError(
            detail::concat(who_, ": ", description,
                           ": a stage it runs after failed: ", detail::message_of(e)),
            __FILE__, __LINE__)));
        return failed;
      }
      after = nullptr;
    }
  }
  DeviceGuard guard(device_, who_);
  cudaEvent_t done = take_event();
  std::exception_ptr failure;
  bool issued = false;
  {
    std::lock_guard<std::mutex> lock(nccl_mutex_);
    try {
      throw_if_poisoned(op);
      if (ctx) {
        // After the work enqueued so far on the caller's stream, without a host sync.
        const auto caller = static_cast<cudaStream_t>(ctx->stream);
        RELAXCC_CUDA_CHECK(cudaEventRecord(ready_event_, caller), who_, "cudaEventRecord",
                           options.label);
        RELAXCC_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_event_, 0), who_,
                           "cudaStreamWaitEvent", options.label);
      }
      if (after)
        RELAXCC_CUDA_CHECK(cudaStreamWaitEvent(stream_, after->event(), 0), who_,
                           "cudaStreamWaitEvent", options.label);
      issued = true;
      issue(comm_, stream_);
      settle(call, options.label, Clock::now() + timeout_);
      RELAXCC_CUDA_CHECK(cudaEventRecord(done, stream_), who_, "cudaEventRecord", options.label);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (failure) {
    give_event(done);
    // NCCL calls were made: the communicator's state is unknown.
    if (issued && !poisoned())
      poison(detail::concat(description, " failed: ", detail::message_of(failure)), true);
    std::rethrow_exception(failure);
  }
  auto work =
      std::make_shared<NcclWork>(std::move(description), shared_from_this(), done, std::move(keep));
  bool late = false, wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++operations_;
    if (poisoned())
      late = true;
    else
      pending_.push_back(work);
    wake = deep_idle_;
  }
  if (late) {
    // Poisoned meanwhile: the NCCL calls were made, so the buffers stay
    // alive until the event completed.
    park(work);
    throw_if_poisoned(op);
  }
  // A progress thread idle for a short while finds the operation by itself:
  // no wake-up (a system call) on the path of every operation.
  if (wake) cv_.notify_all();
  return work;
}

void NcclState::progress_loop() {
  if (cudaSetDevice(device_) != cudaSuccess)
    RELAXCC_LOG(warn, who_, ": progress thread: cudaSetDevice failed");
  const auto spin = std::chrono::microseconds(tunables_.spin_us);
  const auto max_sleep = std::chrono::microseconds(std::max<int64_t>(tunables_.max_sleep_us, 1));
  auto sleep = std::chrono::microseconds(1);
  auto busy_since = Clock::now();
  // Idle, the thread looks for new operations every kIdleTick for
  // kIdleTicks ticks, then sleeps until an enqueue notifies it.
  constexpr auto kIdleTick = std::chrono::milliseconds(1);
  constexpr int kIdleTicks = 1000;
  int idle_ticks = 0;
  const auto has_work = [this] {
    return stopping_ || !pending_.empty() || !tasks_.empty() || !parked_.empty();
  };
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (stopping_) {
      // shutdown() waited for the parked operations (bounded); what is left
      // is released off the lock (their destructors take mutex_).
      std::vector<std::shared_ptr<NcclWork>> left;
      left.swap(parked_);
      lock.unlock();
      return;
    }
    if (pending_.empty() && tasks_.empty() && parked_.empty()) {
      if (idle_ticks < kIdleTicks) {
        if (!cv_.wait_for(lock, kIdleTick, has_work)) {
          ++idle_ticks;
          continue;
        }
      } else {
        deep_idle_ = true;
        cv_.wait(lock, has_work);
        deep_idle_ = false;
      }
      idle_ticks = 0;
      busy_since = Clock::now();
      sleep = std::chrono::microseconds(1);
      continue;
    }
    if (!tasks_.empty()) {
      std::vector<std::function<void()>> tasks;
      tasks.swap(tasks_);
      lock.unlock();
      for (auto& task : tasks) task();
      lock.lock();
      continue;
    }
    // The oldest operations first: their events complete in stream order.
    std::vector<std::shared_ptr<NcclWork>> ready;
    std::shared_ptr<NcclWork> front;
    while (!pending_.empty()) {
      if (pending_.front()->is_completed()) {
        // A Work failed by a timed-out wait() or a CUDA error completed
        // before its event: parked until the device let go of its buffers.
        if (pending_.front()->exception())
          parked_.push_back(std::move(pending_.front()));
        else
          ready.push_back(std::move(pending_.front()));
        pending_.pop_front();
        continue;
      }
      front = pending_.front();
      break;
    }
    lock.unlock();
    if (front) {
      poll(*front);
      if (front->is_completed()) ready.push_back(front);
    }
    ready.clear();  // releases the buffers of completed operations here
    bool failed = false;
    std::string error;
    if (front && !front->is_completed()) {
      // An asynchronous NCCL error fails everything pending.
      std::unique_lock<std::mutex> nccl_lock(nccl_mutex_, std::try_to_lock);
      if (nccl_lock.owns_lock() && comm_) {
        ncclResult_t state = ncclSuccess;
        const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
        if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
          failed = true;
          error = detail::concat(
              who_, ": ncclCommGetAsyncError: ", ncclGetErrorString(r != ncclSuccess ? r : state),
              " (", ncclGetLastError(comm_), ")");
        }
      }
    }
    if (!failed && front && !front->is_completed() &&
        watchdog_.overdue(front->submitted(), Clock::now())) {
      // Nobody's wait() ended it (a waiter with the default timeout would
      // have, at the same time): the watchdog does.
      expire(*front);
    }
    if (failed) {
      // Poisoned (and aborted) before the pending operations fail with the
      // error, so that their callbacks see poisoned().
      std::exception_ptr device_error;
      try {
        device_error = std::make_exception_ptr(DeviceError(error, __FILE__, __LINE__));
      } catch (...) {
      }
      poison(error, true, device_error);
    }
    const bool drained = drain_parked();
    const bool progressed = (front && front->is_completed()) || drained;
    front.reset();
    if (progressed) {
      busy_since = Clock::now();
      sleep = std::chrono::microseconds(1);
    } else if (Clock::now() - busy_since < spin) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, max_sleep);
    }
    lock.lock();
  }
}

std::shared_ptr<void> NcclState::take_block(size_t bytes) {
  const size_t size_class = std::bit_ceil(std::max<size_t>(bytes, 4096));
  void* block = nullptr;
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    auto it = pool_.find(size_class);
    if (it != pool_.end() && !it->second.empty()) {
      block = it->second.back();
      it->second.pop_back();
      pooled_ -= size_class;
    }
  }
  if (!block) {
    const ncclResult_t r = ncclMemAlloc(&block, size_class);
    RELAXCC_ENFORCE(r == ncclSuccess, DeviceError, who_, ": ncclMemAlloc of ", size_class,
                    " bytes: ", ncclGetErrorString(r));
  }
  std::weak_ptr<NcclState> weak = weak_from_this();
  std::shared_ptr<void> owner(block, [weak, size_class, device = device_, who = who_](void* p) {
    if (auto state = weak.lock()) {
      state->give_block(size_class, p);
      return;
    }
    QuietDeviceGuard guard(device);
    const ncclResult_t f = ncclMemFree(p);
    if (f != ncclSuccess) RELAXCC_LOG(warn, who, ": ncclMemFree: ", ncclGetErrorString(f));
  });
  RELAXCC_CUDA_CHECK(cudaMemsetAsync(block, 0, bytes, aux_stream_), who_, "cudaMemsetAsync",
                     "allocate");
  RELAXCC_CUDA_CHECK(cudaStreamSynchronize(aux_stream_), who_, "cudaStreamSynchronize", "allocate");
  return owner;
}

void NcclState::give_block(size_t size_class, void* block) noexcept {
  try {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    if (pooled_ + size_class <= kPoolBytes) {
      pool_[size_class].push_back(block);
      pooled_ += size_class;
      return;
    }
  } catch (...) {
  }
  QuietDeviceGuard guard(device_);
  const ncclResult_t f = ncclMemFree(block);
  if (f != ncclSuccess) RELAXCC_LOG(warn, who_, ": ncclMemFree: ", ncclGetErrorString(f));
}

void NcclState::expire(NcclWork& work) noexcept {
  try {
    const auto elapsed = std::chrono::duration_cast<milliseconds>(Clock::now() - work.submitted());
    const std::string reason = watchdog_.poison_reason(work.description());
    RELAXCC_LOG(error, who_, ": ", watchdog_.timeout_message(who_, work.description(), elapsed));
    // Poisoned first, so that the Work's callbacks (run by complete) see it;
    // the abort comes before the other pending operations fail.
    mark_poisoned(reason);
    work.complete(std::make_exception_ptr(
        Timeout(watchdog_.timeout_message(who_, work.description(), elapsed), __FILE__, __LINE__)));
    poison(reason, true);
  } catch (...) {
    poison("watchdog: an operation pending past the timeout", true);
  }
}

void NcclState::shutdown() noexcept {
  const bool on_progress_thread = std::this_thread::get_id() == progress_.get_id();
  QuietDeviceGuard guard(device_);
  if (!on_progress_thread) {
    // Operations in flight finish first, within the timeout; past it the NCCL
    // communicator is aborted, and the device work of the operations it
    // failed gets another timeout to end before their buffers are released.
    auto deadline = Clock::now() + timeout_;
    bool aborted = false;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (pending_.empty() && parked_.empty()) break;
      }
      if (Clock::now() >= deadline) {
        if (aborted) {
          RELAXCC_LOG(warn, who_,
                      ": released with device work still running after ncclCommAbort; its "
                      "buffers are released now");
          break;
        }
        poison("released with operations in flight past the timeout", true);
        aborted = true;
        deadline = Clock::now() + timeout_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } else {
    poison("released by a callback with operations in flight", false);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (progress_.joinable()) {
    if (on_progress_thread)
      progress_.detach();
    else
      progress_.join();
  }
  std::lock_guard<std::mutex> lock(nccl_mutex_);
  if (!comm_) return;
  // ncclCommFinalize flushes what NCCL still holds; past the timeout, abort.
  ncclResult_t r = ncclCommFinalize(comm_);
  if (r == ncclSuccess || r == ncclInProgress) {
    const auto deadline = Clock::now() + timeout_;
    ncclResult_t state = ncclInProgress;
    while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress &&
           Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (state == ncclSuccess) {
      // After ncclCommDestroy the handle may be freed (or being freed, when
      // in progress): no call on it afterwards; an error leaks it rather
      // than risk a use after free.
      r = ncclCommDestroy(comm_);
      if (r != ncclSuccess) RELAXCC_LOG(warn, who_, ": ncclCommDestroy: ", ncclGetErrorString(r));
      comm_ = nullptr;
      return;
    }
  }
  RELAXCC_LOG(warn, who_, ": ncclCommFinalize did not complete; aborting the NCCL communicator");
  (void)ncclCommAbort(comm_);
  comm_ = nullptr;
}

}  // namespace relaxcc::nccl
