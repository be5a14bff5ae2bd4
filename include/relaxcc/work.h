// Work: the handle every asynchronous relaxcc call returns.
//
// A Work completes exactly once, with success or with a stored exception.
// It keeps the operation's buffers alive (the TensorView owners it was given
// and its internal scratch) until the transport has let go of them.
//
// Waiting. The rule on timeouts:
//   - wait() without a timeout waits for the Work's default timeout:
//       - a communicator's operation: the communicator's timeout
//         (Tunables::timeout_ms of its options, RELAXCC_TIMEOUT_MS unless
//         the caller set it; an NCCL communicator's `timeout` option);
//       - then(): the default timeout of the Work it was called on;
//       - when_all(): the largest of its inputs' default timeouts (so the
//         composite waits as long as the slowest of them would);
//       - a relaxed primitive's result (relaxcc/relaxed/): composed with
//         then() and when_all() from its communicator's operations, or
//         given the timeout of one of them, so it is its communicator's too;
//       - any other Work: the timeout it was constructed with (negative:
//         Tunables{}.timeout_ms, the compiled default, not the environment).
//     Waiting on a composite (then(), when_all(), a relaxed primitive's
//     result) drives its parts as their own waits would, and when its
//     timeout passes it times out the first part still pending as that
//     part's own wait would: for a communicator's operation, the
//     communicator is poisoned and the operation fails, even when nobody
//     waits on that operation's own Work.
//   - wait(timeout) is the blocking wait. When the timeout passes first it
//     throws Timeout and POISONS the communicator the operation runs on (see
//     communicator.h): a collective that did not finish in time leaves its
//     peers in an unknown state, so the communicator accepts nothing more.
//   - wait_for(timeout) and is_completed() only look: when the Work is still
//     pending they return false and change nothing, so a caller can wait with
//     a bound (a step deadline, a shutdown check) and go on using the
//     communicator.
//
// Progress. A communicator's operations move while some thread drives its
// engine: a thread waiting on one of its Works (wait(), or wait_for() with
// any timeout, zero included) does so itself, and the engine's own thread
// does it while nobody waits. So a Work completes on either thread.
//
// Completion callbacks. then(callback) runs `callback` once the Work has
// completed, successfully or not, and returns a Work that completes when the
// callback has returned. The callback runs on the thread that completes the
// Work: for a communicator's operation that is whichever thread drives the
// engine at that moment, its engine thread or a thread waiting on any Work of
// the same engine (not necessarily this one); for a Work that has already
// completed, the caller of then(), at once.
// A callback must not block: it must not wait on any Work, take locks held
// across a wait, or do I/O. It may read the Work's result, submit operations
// on any communicator, register further callbacks and run short local
// computations (scaling a bucket); longer work belongs on a thread of the
// caller's, woken by the callback.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace relaxcc {

class Work;
using WorkPtr = std::shared_ptr<Work>;
namespace detail {
class ThenWork;
class AllWork;
}  // namespace detail

class Work : public std::enable_shared_from_this<Work> {
 public:
  using Callback = std::function<void(const Work&)>;

  // `default_timeout`: what wait() uses when given a negative timeout
  // (negative here: Tunables{}.timeout_ms, the compiled default; a Work that
  // stands for a communicator's operations takes the communicator's, see
  // above). `spin`: how long wait() polls before it blocks (zero: block at
  // once).
  explicit Work(std::string description,
                std::chrono::milliseconds default_timeout = std::chrono::milliseconds(-1),
                std::chrono::microseconds spin = std::chrono::microseconds(0));
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // True once the operation finished, successfully or not. Never blocks.
  bool is_completed() const noexcept { return done_.load(std::memory_order_acquire); }

  // Waits until the operation finished and rethrows its exception, if any.
  // A negative timeout uses default_timeout().
  // When the timeout passes first, throws Timeout naming the operation, its
  // sequence number, tag, peers and the elapsed time, and POISONS the
  // communicator the operation runs on.
  void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));

  // Waits at most `timeout` without side effects: false while the operation
  // is still pending; true once it finished, rethrowing its exception if it
  // failed. A zero timeout tests without blocking.
  bool wait_for(std::chrono::milliseconds timeout);

  // The stored exception of a completed operation; null while pending or on
  // success.
  std::exception_ptr exception() const;

  // Runs `callback` after completion (see above) and returns a Work that
  // completes once the callback returned: with the callback's exception if it
  // threw, otherwise with this Work's. The returned Work has this one's
  // default timeout; waiting on it with an expiring wait() poisons what
  // waiting on this one would.
  WorkPtr then(Callback callback, std::string description = {});

  // Makes work enqueued later on `stream` (a cudaStream_t) wait for this
  // operation, without blocking the host (for an NCCL communicator's Work, a
  // null stream is CUDA's legacy default stream). A host operation (one that
  // completes on the host, such as the device relaxed primitives) has no
  // event: it ignores a null stream; for any other stream it returns once it
  // completed, rethrows its failure, and throws Unsupported while it is in
  // flight (call wait() first).
  virtual void block_stream(void* stream);

  // Which peers an operation heard from, once it completed: for a
  // point_to_point batch, the peers of its receives whose message arrived
  // (contributors) and of those abandoned at its deadline (missing_peers;
  // see collectives/point_to_point.h), each in batch order, a peer once per
  // receive. Empty for other operations, whose every peer contributes or
  // which fail. partial(): some receive was abandoned.
  std::vector<int> contributors() const;
  std::vector<int> missing_peers() const;
  bool partial() const;

  // "allreduce #12 (ring, tag 49, peers 1,3)": what this Work is for.
  const std::string& description() const noexcept;

  // What wait() waits without a timeout (see the rule above).
  std::chrono::milliseconds default_timeout() const noexcept { return default_timeout_; }

  // Completes the Work with `error` (null: success) and runs its callbacks on
  // the calling thread. Only the first call has an effect. For code that
  // produces Works: transports, and algorithms that compose them.
  void complete(std::exception_ptr error);
  // Records which peers contributed (see contributors()); call before complete().
  void set_contributions(std::vector<int> contributors, std::vector<int> missing);

 protected:
  // The description of a Work constructed with an empty one, built on the
  // first call of description() (so that a call that nobody describes does
  // not pay for the string).
  virtual std::string describe() const { return {}; }
  // Blocks until the Work completed or `deadline` passed; returns
  // is_completed(). wait() and wait_for() call it while the Work is pending.
  // The default blocks on a condition variable (block_until); a transport's
  // Work drives its progress here instead.
  virtual bool await(std::chrono::steady_clock::time_point deadline);
  // Blocks on the condition variable that complete() notifies.
  bool block_until(std::chrono::steady_clock::time_point deadline);
  // then() queued a callback on this pending Work (a transport's Work makes
  // sure something will complete it without a waiter).
  virtual void on_callback_queued() {}

  // Called (once per expired wait) when wait() times out, before it throws:
  // a transport's Work poisons its communicator here. Returns the state of
  // the operation for the Timeout message ("waiting for: rank 3 (header)");
  // empty when unknown.
  virtual std::string on_timeout(const std::string& reason);

  // Makes a completed Work pending again, as if constructed now with
  // `description`, for a transport that reuses its Works. Only when nothing
  // else references it: no owner, waiter or callback.
  void reset(std::string description);

 private:
  friend class detail::ThenWork;
  friend class detail::AllWork;
  mutable std::string description_;  // built by describe() when empty
  mutable std::atomic<bool> described_{false};
  const std::chrono::milliseconds default_timeout_;
  const std::chrono::microseconds spin_;
  std::chrono::steady_clock::time_point created_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};  // set under mutex_ after error_
  std::exception_ptr error_;
  std::vector<int> contributors_;
  std::vector<int> missing_;
  std::vector<Callback> callbacks_;
};

// A Work that completes once every one of `works` has completed: then
// `finish` (if any) runs, on the thread that completed the last of them, with
// the result Work (to record contributions), unless one of them failed. The
// result completes with the first of their errors in `works` order, or with
// what `finish` threw. `finish` follows the rules of a completion callback.
// Its default timeout is the largest of `works`' (no works: the compiled
// default; it has completed already). An expiring wait() on the result
// poisons what a wait on the first one still pending would. c10d's
// collectAll.
WorkPtr when_all(std::vector<WorkPtr> works, std::function<void(Work& result)> finish,
                 std::string description);

}  // namespace relaxcc
