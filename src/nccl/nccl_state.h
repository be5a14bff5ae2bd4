// NcclState: what outlives an NcclCommunicator while Works refer to it (the
// NCCL communicator, the streams, the event pool, the memory blocks and the
// progress thread), and NcclWork, an operation's Work completed by its CUDA
// event. Every NCCL call on the communicator is made under nccl_mutex_, and
// each one is settled (ncclCommGetAsyncError until it is no longer
// ncclInProgress, the rule of non-blocking communicators) before the next,
// with the communicator's timeout as the bound.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "relaxcc/communicator.h"
#include "relaxcc/errors.h"
#include "relaxcc/tunables.h"
#include "src/nccl/watchdog.h"

namespace relaxcc::nccl {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// "rank 1 (cuda:0): ncclAllReduce of 'bucket 3'"
inline std::string subject(const std::string& who, const char* call, const std::string& label) {
  return detail::concat(who, ": ", call, detail::of_label(label));
}

inline std::string cuda_message(cudaError_t e) {
  return detail::concat(cudaGetErrorString(e), " (", cudaGetErrorName(e), ")");
}

}  // namespace relaxcc::nccl

// A failing CUDA call: DeviceError naming the rank, the device, the call and the tensor.
#define RELAXCC_CUDA_CHECK(expr, who, call, label)                                           \
  do {                                                                                       \
    const cudaError_t relaxcc_e_ = (expr);                                                   \
    if (relaxcc_e_ != cudaSuccess) [[unlikely]]                                              \
      RELAXCC_THROW(DeviceError, subject(who, call, label), ": ", cuda_message(relaxcc_e_)); \
  } while (0)

namespace relaxcc::nccl {

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

}  // namespace relaxcc::nccl
