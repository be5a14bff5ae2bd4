// NcclCommunicator (include/relaxcc/nccl_communicator.h): NCCL calls on the
// communicator's own stream, each operation's Work completed by a CUDA event.
//
// NcclState holds what outlives the communicator object while Works refer
// to it: the NCCL communicator, the streams, the event pool and the progress
// thread. Every NCCL call on the communicator is made under nccl_mutex_, and
// each one is settled (ncclCommGetAsyncError until it is no longer
// ncclInProgress, the rule of non-blocking communicators) before the next,
// with the communicator's timeout as the bound.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "relaxcc/errors.h"
#include "relaxcc/logging.h"
#include "relaxcc/mpi_communicator.h"
#include "relaxcc/nccl_communicator.h"
#include "src/collectives/argument_checks.h"
#include "src/nccl/device_checks.h"
#include "src/nccl/nccl_types.h"
#include "src/nccl/watchdog.h"

namespace relaxcc::nccl {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// "rank 1 (cuda:0): ncclAllReduce of 'bucket 3'"
std::string subject(const std::string& who, const char* call, const std::string& label) {
  return detail::concat(who, ": ", call, detail::of_label(label));
}

std::string cuda_message(cudaError_t e) {
  return detail::concat(cudaGetErrorString(e), " (", cudaGetErrorName(e), ")");
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& error) {
    return error.message();
  } catch (const std::exception& error) {
    return error.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

// A failing CUDA call: DeviceError naming the rank, the device, the call and the tensor.
#define RELAXCC_CUDA_CHECK(expr, who, call, label)                                           \
  do {                                                                                       \
    const cudaError_t relaxcc_e_ = (expr);                                                   \
    if (relaxcc_e_ != cudaSuccess) [[unlikely]]                                              \
      RELAXCC_THROW(DeviceError, subject(who, call, label), ": ", cuda_message(relaxcc_e_)); \
  } while (0)

namespace {

// Makes `device` current on the calling thread for the guard's lifetime.
class DeviceGuard {
 public:
  DeviceGuard(int device, const std::string& who) : device_(device) {
    RELAXCC_CUDA_CHECK(cudaGetDevice(&previous_), who, "cudaGetDevice", "");
    if (previous_ != device_) RELAXCC_CUDA_CHECK(cudaSetDevice(device_), who, "cudaSetDevice", "");
  }
  ~DeviceGuard() {
    if (previous_ != device_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = -1;
};

// DeviceGuard that never throws, for destructors and shutdown: a thread that
// releases the last reference gets its own current device back.
class QuietDeviceGuard {
 public:
  explicit QuietDeviceGuard(int device) noexcept : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device_) (void)cudaSetDevice(device_);
  }
  ~QuietDeviceGuard() {
    if (previous_ >= 0 && previous_ != device_) (void)cudaSetDevice(previous_);
  }
  QuietDeviceGuard(const QuietDeviceGuard&) = delete;
  QuietDeviceGuard& operator=(const QuietDeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = -1;
};

class NcclWork;

class NcclState : public std::enable_shared_from_this<NcclState> {
 public:
  NcclState(int rank, int size, int device, const Tunables& tunables, milliseconds timeout)
      : rank_(rank),
        size_(size),
        device_(device),
        tunables_(tunables),
        timeout_(timeout),
        who_(detail::concat("rank ", rank, " (", Device::cuda(device), ")")),
        watchdog_(timeout),
        sent_to_(static_cast<size_t>(size), 0),
        received_from_(static_cast<size_t>(size), 0) {}
  ~NcclState();
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;

  // Creates the NCCL communicator (bounded by the timeout), the streams, the
  // events and the barrier buffer, then starts the progress thread.
  void init(const ncclUniqueId& id);
  // Lets pending operations finish (bounded by the timeout; then aborts),
  // stops the progress thread and releases the NCCL and CUDA resources.
  void shutdown() noexcept;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int device() const noexcept { return device_; }
  const std::string& who() const noexcept { return who_; }
  milliseconds timeout() const noexcept { return timeout_; }
  const Tunables& tunables() const noexcept { return tunables_; }

  bool poisoned() const noexcept { return poisoned_.load(std::memory_order_acquire); }
  void throw_if_poisoned(const char* op) const;
  // Poisons the communicator: later calls throw CommunicatorPoisoned, pending
  // operations complete with `pending_error` (null: CommunicatorPoisoned).
  // `abort`: ncclCommAbort too, before the pending operations complete.
  void poison(const std::string& reason, bool abort,
              std::exception_ptr pending_error = nullptr) noexcept;
  // The first step of poison(): later calls throw CommunicatorPoisoned; the
  // abort and the pending operations are left to poison().
  void mark_poisoned(const std::string& reason) noexcept;

  // Submits one operation: orders the communicator's stream after `ctx`'s
  // stream and options.after, runs `issue(comm, stream)` (the NCCL calls),
  // settles them and records the operation's completion event.
  WorkPtr enqueue(const char* op, const char* call, const OpOptions& options,
                  const ExecContext* ctx, std::vector<TensorView> keep, const std::string& detail,
                  const std::function<void(ncclComm_t, cudaStream_t)>& issue);

  // The result of an NCCL call made inside enqueue's `issue`: DeviceError
  // unless it succeeded or is in progress (non-blocking communicator).
  void check_nccl(ncclResult_t r, const char* call, const std::string& label) const;

  void count_traffic(int peer, uint64_t sent, uint64_t received);
  CommStats stats() const;

  // Runs `fn` on the progress thread.
  void post(std::function<void()> fn);
  // Wakes the progress thread (a callback was queued on a pending Work).
  void wake() { cv_.notify_all(); }

  void* barrier_buffer() const noexcept { return barrier_buffer_; }

  // allocate()'s memory: an ncclMemAlloc block of at least `bytes` (rounded
  // up to a power of two, 4 KiB at least), taken from the pool when one of
  // that size was returned, zeroed on the aux stream; its owner returns it
  // to the pool (or frees it once the communicator is gone or the pool holds
  // kPoolBytes). So a caller that allocates the same sizes call after call
  // (the device compressed allreduce's payloads) pays for ncclMemAlloc once.
  std::shared_ptr<void> take_block(size_t bytes);
  cudaStream_t aux_stream() const noexcept { return aux_stream_; }

  void give_event(cudaEvent_t e) noexcept;
  // Completes `work` if its event completed (DeviceError and poisoning on a
  // CUDA failure). Any thread.
  void poll(NcclWork& work) noexcept;

 private:
  cudaEvent_t take_event();
  // Polls ncclCommGetAsyncError until the last call is no longer in
  // progress: Timeout past `deadline`, DeviceError on an NCCL error.
  // Caller holds nccl_mutex_ (or is init()).
  void settle(const char* call, const std::string& label, Clock::time_point deadline);
  // ncclCommAbort, once.
  void abort_comm() noexcept;
  void progress_loop();
  // The watchdog (watchdog.h): fails `work`, pending past the timeout with
  // nobody's wait() having ended it, with Timeout, aborts the NCCL
  // communicator and poisons this one. Progress thread, mutex_ not held.
  void expire(NcclWork& work) noexcept;
  // Completes every pending operation with `error` and parks it until its
  // event completed (its buffers stay alive while the device may use them).
  void fail_pending(const std::exception_ptr& error) noexcept;
  // Parks a completed operation whose event may still be pending.
  void park(std::shared_ptr<NcclWork> work) noexcept;
  // Drops the parked operations whose events completed (or failed); true
  // when one was dropped. Progress thread, mutex_ not held.
  bool drain_parked() noexcept;

  const int rank_, size_, device_;
  const Tunables tunables_;
  const milliseconds timeout_;
  const std::string who_;
  const Watchdog watchdog_;  // the progress thread's bound on pending operations

  std::mutex nccl_mutex_;  // every NCCL call on comm_, in order
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaStream_t aux_stream_ = nullptr;  // allocate()'s memsets: never stuck behind NCCL
  cudaEvent_t ready_event_ = nullptr;  // the caller's stream, under nccl_mutex_
  void* barrier_buffer_ = nullptr;     // one int32 on the device

  // take_block's pool: idle blocks by size class, under pool_mutex_.
  static constexpr size_t kPoolBytes = size_t{256} << 20;
  void give_block(size_t size_class, void* block) noexcept;
  mutable std::mutex pool_mutex_;
  std::map<size_t, std::vector<void*>> pool_;
  size_t pooled_ = 0;
  std::atomic<uint64_t> sequence_{0};

  std::atomic<bool> poisoned_{false};
  mutable std::mutex mutex_;  // what follows
  std::string poison_reason_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<NcclWork>> pending_;  // in stream order
  // Completed by a poisoning while their events may be pending: they hold
  // the operations' buffers until the progress thread sees the events done.
  std::vector<std::shared_ptr<NcclWork>> parked_;
  std::vector<std::function<void()>> tasks_;
  std::vector<cudaEvent_t> free_events_;
  bool stopping_ = false;
  bool deep_idle_ = false;  // the progress thread waits until notified
  std::thread progress_;
  uint64_t operations_ = 0;
  uint64_t bytes_sent_ = 0, bytes_received_ = 0;
  std::vector<uint64_t> sent_to_, received_from_;
};

class NcclWork final : public Work {
 public:
  NcclWork(std::string description, std::shared_ptr<NcclState> state, cudaEvent_t event,
           std::vector<TensorView> keep)
      : Work(std::move(description), state->timeout()),
        state_(std::move(state)),
        event_(event),
        keep_(std::move(keep)) {}
  ~NcclWork() override { state_->give_event(event_); }

  cudaEvent_t event() const noexcept { return event_; }
  // When the operation's NCCL calls were made (the watchdog's start).
  Clock::time_point submitted() const noexcept { return submitted_; }

  void block_stream(void* stream) override {
    if (is_completed())
      if (std::exception_ptr e = exception()) std::rethrow_exception(e);
    RELAXCC_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), event_, 0),
                       state_->who(), "cudaStreamWaitEvent", description());
  }

 protected:
  // A waiting thread whose current device is the communicator's polls the
  // event itself: spinning for RELAXCC_SPIN_US, then sleeping with a back-off
  // up to RELAXCC_MAX_SLEEP_US. Any other thread leaves the polling to the
  // progress thread and blocks (a CUDA call there could create a context on
  // a device this process does not use).
  bool await(Clock::time_point deadline) override {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != state_->device())
      return block_until(deadline);
    const Tunables& t = state_->tunables();
    const auto spin_until = Clock::now() + std::chrono::microseconds(t.spin_us);
    const auto max_sleep = std::chrono::microseconds(std::max<int64_t>(t.max_sleep_us, 1));
    auto sleep = std::chrono::microseconds(1);
    while (!is_completed()) {
      state_->poll(*this);
      if (is_completed()) break;
      const auto now = Clock::now();
      if (now >= deadline) return false;
      if (now < spin_until) {
        sched_yield();
        continue;
      }
      std::this_thread::sleep_for(std::min<Clock::duration>(
          sleep, std::chrono::duration_cast<Clock::duration>(deadline - now)));
      sleep = std::min(sleep * 2, max_sleep);
    }
    return true;
  }

  // then() on a pending Work: the progress thread runs the callback promptly.
  void on_callback_queued() override { state_->wake(); }

  // The operation is late: it completes with Timeout, the NCCL communicator
  // is aborted and this one poisoned.
  std::string on_timeout(const std::string& reason) override {
    // Poisoned first, so that this Work's callbacks (run by complete) see it.
    state_->mark_poisoned(reason);
    complete(std::make_exception_ptr(
        Timeout(detail::concat(state_->who(), ": ", description(),
                               " did not complete in time; the NCCL communicator was aborted"),
                __FILE__, __LINE__)));
    state_->poison(reason, true);
    return detail::concat("waiting for: the CUDA event after its NCCL calls on ", state_->who(),
                          "'s stream; ncclCommAbort called");
  }

 private:
  std::shared_ptr<NcclState> state_;
  cudaEvent_t event_;
  std::vector<TensorView> keep_;  // the operation's buffers (their owners)
  const Clock::time_point submitted_ = Clock::now();
};

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
            detail::concat(who_, ": ", description, ": a stage it runs after failed: ", what_of(e)),
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
      poison(detail::concat(description, " failed: ", what_of(failure)), true);
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

std::string shape(const TensorView& t) {
  return detail::concat(t.numel, " x ", dtype_name(t.dtype));
}

size_t count_of(const TensorView& t) {
  return static_cast<size_t>(t.numel);
}

void* byte_offset(void* data, int64_t elements, DType dtype) {
  return static_cast<unsigned char*>(data) + elements * static_cast<int64_t>(dtype_size(dtype));
}

CommunicatorPtr make_nccl_communicator(CommunicatorPtr host, int device,
                                       const NcclCommunicatorOptions& options,
                                       milliseconds timeout);

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclState> state, CommunicatorPtr host,
                   NcclCommunicatorOptions options, milliseconds timeout)
      : state_(std::move(state)),
        host_(std::move(host)),
        options_(std::move(options)),
        timeout_(timeout) {
    options_.bootstrap = nullptr;  // host_ holds it
  }
  ~NcclCommunicator() override { state_->shutdown(); }

  int rank() const override { return state_->rank(); }
  int size() const override { return state_->size(); }
  bool poisoned() const override { return state_->poisoned(); }
  // NCCL has no notices: the NCCL communicator is aborted here, and the
  // host communicator (the bootstrap) poisoned, notices included, so peers
  // learn it in their host-side exchanges; a peer inside an NCCL
  // collective of this communicator fails at its own timeout.
  void poison(const std::string& reason) override {
    if (!state_->poisoned()) state_->poison(reason, true);
    host_->poison(reason);
  }
  CommStats stats() const override { return state_->stats(); }
  // NCCL has no tags: any tag is accepted, and messages match in posting order.
  int max_p2p_tag() const override { return (1 << 30) - 1; }

  std::shared_ptr<Communicator> group(const std::vector<int>& members,
                                      const GroupOptions& options) override {
    state_->throw_if_poisoned("group");
    return derive(host_->group(members, options));
  }
  std::shared_ptr<Communicator> split(int color, int key, const SplitOptions& options) override {
    state_->throw_if_poisoned("split");
    return derive(host_->split(color, key, options));
  }
  std::shared_ptr<Communicator> split_node_local(const SplitOptions& options) override {
    state_->throw_if_poisoned("split_node_local");
    return derive(host_->split_node_local(options));
  }

  // The bootstrap: the host communicator over these ranks.
  std::shared_ptr<Communicator> host_communicator() const override { return host_; }

  TensorView allocate(int64_t numel, DType dtype) override {
    RELAXCC_ENFORCE(static_cast<int>(dtype) < kNumDTypes, InvalidArgument, state_->who(),
                    ": allocate: unknown dtype ", static_cast<int>(dtype));
    RELAXCC_ENFORCE(numel >= 0, InvalidArgument, state_->who(),
                    ": allocate: negative element count ", numel);
    const Device where = Device::cuda(state_->device());
    if (numel == 0) return TensorView(nullptr, 0, dtype, where);
    const size_t bytes = static_cast<size_t>(numel) * dtype_size(dtype);
    DeviceGuard guard(state_->device(), state_->who());
    std::shared_ptr<void> owner = state_->take_block(bytes);
    void* data = owner.get();
    return TensorView(data, numel, dtype, where, std::move(owner));
  }

  WorkPtr point_to_point(const std::vector<P2POp>& ops, const ExecContext& ctx,
                         const P2POptions& options) override {
    check_point_to_point(ops, options, size(), max_p2p_tag());
    RELAXCC_ENFORCE(options.round == 0 && !options.deadline, Unsupported, state_->who(),
                    ": point_to_point: rounds and deadlines (P2POptions::round, deadline) are "
                    "not supported by the NCCL communicator");
    std::vector<TensorView> keep;
    keep.reserve(ops.size());
    for (const P2POp& op : ops) {
      check(op.tensor, ctx,
            op.kind == P2POp::Kind::send ? "point_to_point send tensor"
                                         : "point_to_point receive tensor",
            options.label);
      keep.push_back(op.tensor);
    }
    return state_->enqueue(
        "point_to_point", "ncclGroupEnd", options, &ctx, std::move(keep),
        detail::concat(ops.size(), " ops"), [&](ncclComm_t comm, cudaStream_t stream) {
          group_calls(options.label, [&] {
            for (const P2POp& op : ops) {
              const ncclDataType_t t = nccl_dtype(op.tensor.dtype);
              if (op.kind == P2POp::Kind::send)
                state_->check_nccl(
                    ncclSend(op.tensor.data, count_of(op.tensor), t, op.peer, comm, stream),
                    "ncclSend", options.label);
              else
                state_->check_nccl(
                    ncclRecv(op.tensor.data, count_of(op.tensor), t, op.peer, comm, stream),
                    "ncclRecv", options.label);
            }
          });
          for (const P2POp& op : ops)
            state_->count_traffic(op.peer, op.kind == P2POp::Kind::send ? op.tensor.nbytes() : 0,
                                  op.kind == P2POp::Kind::recv ? op.tensor.nbytes() : 0);
        });
  }

  using Communicator::allreduce;
  WorkPtr allreduce(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                    const AllreduceOptions& options) override {
    check_allreduce(input, output, options);
    check(input, ctx, "allreduce input", options.label);
    check(output, ctx, "allreduce output", options.label);
    RELAXCC_ENFORCE(options.algo != AllreduceAlgo::recursive_doubling, Unsupported, state_->who(),
                    ": allreduce: recursive_doubling is not available on the NCCL communicator "
                    "(NCCL picks its own algorithm: pass auto)");
    const ncclDataType_t t = nccl_dtype(output.dtype);
    const ncclRedOp_t op = nccl_op(options.op);
    return state_->enqueue(
        "allreduce", "ncclAllReduce", options, &ctx, {input, output}, shape(output),
        [&](ncclComm_t comm, cudaStream_t stream) {
          if (output.numel == 0) return;  // every rank has no elements: nothing to call
          state_->check_nccl(
              ncclAllReduce(input.data, output.data, count_of(output), t, op, comm, stream),
              "ncclAllReduce", options.label);
        });
  }

  WorkPtr reduce_scatter(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                         const ReduceScatterOptions& options) override {
    check_reduce_scatter(input, output, options, size());
    check(input, ctx, "reduce_scatter input", options.label);
    check(output, ctx, "reduce_scatter output", options.label);
    const ncclDataType_t t = nccl_dtype(output.dtype);
    const ncclRedOp_t op = nccl_op(options.op);
    return state_->enqueue(
        "reduce_scatter", "ncclReduceScatter", options, &ctx, {input, output}, shape(output),
        [&](ncclComm_t comm, cudaStream_t stream) {
          if (output.numel == 0) return;
          state_->check_nccl(
              ncclReduceScatter(input.data, output.data, count_of(output), t, op, comm, stream),
              "ncclReduceScatter", options.label);
        });
  }

  WorkPtr allgather(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                    const AllgatherOptions& options) override {
    const int n = size();
    check_allgatherv(input, output, std::vector<int64_t>(static_cast<size_t>(n), input.numel),
                     rank(), n);
    check(input, ctx, "allgather input", options.label);
    check(output, ctx, "allgather output", options.label);
    const ncclDataType_t t = nccl_dtype(input.dtype);
    return state_->enqueue("allgather", "ncclAllGather", options, &ctx, {input, output},
                           shape(input), [&](ncclComm_t comm, cudaStream_t stream) {
                             if (input.numel == 0) return;
                             state_->check_nccl(ncclAllGather(input.data, output.data,
                                                              count_of(input), t, comm, stream),
                                                "ncclAllGather", options.label);
                           });
  }

  WorkPtr allgatherv(const TensorView& input, const TensorView& output,
                     const std::vector<int64_t>& counts, const ExecContext& ctx,
                     const AllgatherOptions& options) override {
    const int n = size(), me = rank();
    const TensorView own_slot = check_allgatherv(input, output, counts, me, n);
    check(input, ctx, "allgather input", options.label);
    check(output, ctx, "allgather output", options.label);
    const ncclDataType_t t = nccl_dtype(input.dtype);
    return state_->enqueue(
        "allgatherv", "ncclGroupEnd", options, &ctx, {input, output}, shape(input),
        [&](ncclComm_t comm, cudaStream_t stream) {
          copy_async(input, own_slot, stream, options.label);
          // Rank p sends its input to every other rank when counts[p] > 0.
          group_calls(options.label, [&] {
            int64_t offset = 0;
            for (int p = 0; p < n; ++p) {
              const int64_t c = counts[static_cast<size_t>(p)];
              if (p != me && input.numel > 0)
                state_->check_nccl(ncclSend(input.data, count_of(input), t, p, comm, stream),
                                   "ncclSend", options.label);
              if (p != me && c > 0)
                state_->check_nccl(ncclRecv(byte_offset(output.data, offset, output.dtype),
                                            static_cast<size_t>(c), t, p, comm, stream),
                                   "ncclRecv", options.label);
              offset += c;
            }
          });
        });
  }

  WorkPtr broadcast(const TensorView& data, const ExecContext& ctx,
                    const BroadcastOptions& options) override {
    check_broadcast(data, options, size());
    check(data, ctx, "broadcast tensor", options.label);
    const ncclDataType_t t = nccl_dtype(data.dtype);
    return state_->enqueue("broadcast", "ncclBroadcast", options, &ctx, {data},
                           detail::concat(shape(data), ", root ", options.root),
                           [&](ncclComm_t comm, cudaStream_t stream) {
                             if (data.numel == 0) return;
                             state_->check_nccl(ncclBroadcast(data.data, data.data, count_of(data),
                                                              t, options.root, comm, stream),
                                                "ncclBroadcast", options.label);
                           });
  }

  WorkPtr alltoall(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                   const AlltoallOptions& options) override {
    const int n = size();
    check_alltoall(input, n);
    const std::vector<int64_t> counts(static_cast<size_t>(n), input.numel / n);
    return alltoallv(input, counts, output, counts, ctx, options);
  }

  WorkPtr alltoallv(const TensorView& input, const std::vector<int64_t>& send_counts,
                    const TensorView& output, const std::vector<int64_t>& recv_counts,
                    const ExecContext& ctx, const AlltoallOptions& options) override {
    const int n = size(), me = rank();
    check_alltoallv(input, send_counts, output, recv_counts, n);
    check(input, ctx, "alltoall input", options.label);
    check(output, ctx, "alltoall output", options.label);
    const ncclDataType_t t = nccl_dtype(input.dtype);
    return state_->enqueue(
        "alltoallv", "ncclGroupEnd", options, &ctx, {input, output}, shape(input),
        [&](ncclComm_t comm, cudaStream_t stream) {
          std::vector<int64_t> send_at(static_cast<size_t>(n) + 1, 0),
              recv_at(static_cast<size_t>(n) + 1, 0);
          for (size_t p = 0; p < static_cast<size_t>(n); ++p) {
            send_at[p + 1] = send_at[p] + send_counts[p];
            recv_at[p + 1] = recv_at[p] + recv_counts[p];
          }
          const auto own = static_cast<size_t>(me);
          copy_async(input.slice(send_at[own], send_counts[own]),
                     output.slice(recv_at[own], recv_counts[own]), stream, options.label);
          group_calls(options.label, [&] {
            for (int p = 0; p < n; ++p) {
              const auto q = static_cast<size_t>(p);
              if (p == me) continue;
              if (send_counts[q] > 0)
                state_->check_nccl(
                    ncclSend(byte_offset(input.data, send_at[q], input.dtype),
                             static_cast<size_t>(send_counts[q]), t, p, comm, stream),
                    "ncclSend", options.label);
              if (recv_counts[q] > 0)
                state_->check_nccl(
                    ncclRecv(byte_offset(output.data, recv_at[q], output.dtype),
                             static_cast<size_t>(recv_counts[q]), t, p, comm, stream),
                    "ncclRecv", options.label);
            }
          });
        });
  }

  WorkPtr barrier(const BarrierOptions& options) override {
    void* token = state_->barrier_buffer();
    return state_->enqueue(
        "barrier", "ncclAllReduce", options, nullptr, {}, "one int32",
        [&](ncclComm_t comm, cudaStream_t stream) {
          state_->check_nccl(ncclAllReduce(token, token, 1, ncclInt32, ncclMax, comm, stream),
                             "ncclAllReduce", options.label.empty() ? "barrier" : options.label);
        });
  }

  WorkPtr compute(std::function<void()> fn, const OpOptions& options) override {
    state_->throw_if_poisoned("compute");
    std::weak_ptr<NcclState> weak = state_;
    auto guarded = [weak, fn = std::move(fn)] {
      if (auto state = weak.lock()) state->throw_if_poisoned("compute");
      fn();
    };
    if (options.after) {
      // On the thread that completes `after`; its failure fails this Work.
      return options.after->then(
          [guarded](const Work& done) {
            if (!done.exception()) guarded();
          },
          detail::concat("compute after ", options.after->description()));
    }
    auto work = std::make_shared<Work>(
        options.label.empty() ? std::string("compute") : "compute '" + options.label + "'",
        timeout_);
    state_->post([work, guarded] {
      std::exception_ptr error;
      try {
        guarded();
      } catch (...) {
        error = std::current_exception();
      }
      work->complete(std::move(error));
    });
    return work;
  }

 private:
  void check(const TensorView& t, const ExecContext& ctx, const char* what,
             const std::string& label) const {
    check_device_tensor(state_->who(), what, label, t, ctx, state_->device());
  }

  // ncclGroupStart, `calls`, ncclGroupEnd: the group is closed when a call throws.
  void group_calls(const std::string& label, const std::function<void()>& calls) {
    state_->check_nccl(ncclGroupStart(), "ncclGroupStart", label);
    try {
      calls();
    } catch (...) {
      (void)ncclGroupEnd();
      throw;
    }
    state_->check_nccl(ncclGroupEnd(), "ncclGroupEnd", label);
  }

  void copy_async(const TensorView& from, const TensorView& to, cudaStream_t stream,
                  const std::string& label) {
    if (from.nbytes() == 0 || from.data == to.data) return;
    RELAXCC_CUDA_CHECK(
        cudaMemcpyAsync(to.data, from.data, from.nbytes(), cudaMemcpyDeviceToDevice, stream),
        state_->who(), "cudaMemcpyAsync", label);
  }

  // The NCCL communicator over a host sub-communicator, or that host
  // communicator itself when it spans nodes and cross-node traffic goes over MPI.
  CommunicatorPtr derive(const CommunicatorPtr& host) {
    if (!host) return nullptr;
    if (options_.cross_node == CrossNodeTransport::mpi &&
        host->split_node_local()->size() != host->size())
      return host;
    return make_nccl_communicator(host, state_->device(), options_, timeout_);
  }

  std::shared_ptr<NcclState> state_;
  CommunicatorPtr host_;
  NcclCommunicatorOptions options_;
  milliseconds timeout_;
};

CommunicatorPtr make_nccl_communicator(CommunicatorPtr host, int device,
                                       const NcclCommunicatorOptions& options,
                                       milliseconds timeout) {
  const int rank = host->rank(), size = host->size();
  // Rank 0's ncclUniqueId, after a byte that says whether it could make one.
  auto message = std::make_shared<std::array<unsigned char, 1 + sizeof(ncclUniqueId)>>();
  message->fill(0);
  std::string root_error;
  if (rank == 0) {
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r == ncclSuccess) {
      (*message)[0] = 1;
      std::memcpy(message->data() + 1, &id, sizeof id);
    } else {
      root_error = ncclGetErrorString(r);
    }
  }
  BroadcastOptions broadcast;
  broadcast.root = 0;
  broadcast.label = "ncclUniqueId";
  host->broadcast(TensorView(message->data(), static_cast<int64_t>(message->size()), DType::u8,
                             Device::host(), message),
                  ExecContext::host(), broadcast)
      ->wait(timeout);
  RELAXCC_ENFORCE((*message)[0] == 1, DeviceError, "rank ", rank, " (", Device::cuda(device),
                  "): ncclGetUniqueId failed on rank 0",
                  root_error.empty() ? std::string() : ": " + root_error);
  ncclUniqueId id;
  std::memcpy(&id, message->data() + 1, sizeof id);
  auto state = std::make_shared<NcclState>(rank, size, device, options.tunables, timeout);
  state->init(id);
  return std::make_shared<NcclCommunicator>(std::move(state), std::move(host), options, timeout);
}

}  // namespace
}  // namespace relaxcc::nccl

namespace relaxcc {

CommunicatorPtr create_nccl_communicator(const NcclCommunicatorOptions& options) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  RELAXCC_ENFORCE(e == cudaSuccess && devices > 0, Unsupported,
                  "create_nccl_communicator: no usable CUDA device (",
                  e != cudaSuccess ? nccl::cuda_message(e) : std::string("no device is visible"),
                  ")");
  const std::chrono::milliseconds timeout =
      options.timeout.count() >= 0 ? options.timeout
                                   : std::chrono::milliseconds(options.tunables.timeout_ms);
  CommunicatorPtr host = options.bootstrap;
  if (!host) {
    MpiCommunicatorOptions mpi;
    mpi.comm = options.comm;
    mpi.tunables = options.tunables;
    mpi.timeout = timeout;
    host = create_mpi_communicator(mpi);
  }
  RELAXCC_ENFORCE(dynamic_cast<const nccl::NcclCommunicator*>(host.get()) == nullptr,
                  InvalidArgument,
                  "create_nccl_communicator: the bootstrap must be a host (MPI) communicator");
  int device = options.device;
  if (device < 0) {
    const int local = host->split_node_local()->rank();
    RELAXCC_ENFORCE(local < devices, Unsupported, "rank ", host->rank(),
                    ": create_nccl_communicator: this rank is rank ", local,
                    " of its node, but only ", devices,
                    " CUDA device(s) are visible (NCCL needs one device per rank; pass "
                    "NcclCommunicatorOptions::device)");
    device = local;
  }
  RELAXCC_ENFORCE(device < devices, InvalidArgument, "rank ", host->rank(),
                  ": create_nccl_communicator: device ", device, " out of range: ", devices,
                  " CUDA device(s) are visible");
  return nccl::make_nccl_communicator(std::move(host), device, options, timeout);
}

}  // namespace relaxcc
