#include "src/engine/operation.h"

#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <sstream>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "relaxcc/logging.h"
#include "src/engine/engine.h"
#include "src/engine/engine_detail.h"
#include "src/engine/engine_work.h"

namespace relaxcc::engine {

void Operation::reset_for_reuse(int priority) {
  release_seq();
  priority_ = priority;
  seq_ = 0;
  pending_ = computing_ = 0;
  error_ = nullptr;
  stall_reported_ = work_completed_ = false;
  after_.reset();  // work_ stays: submit reuses it when it can
  prologue_ = nullptr;
  released_.store(false, std::memory_order_relaxed);
}

void Operation::release_seq() {
  if (!in_flight_) return;
  in_flight_ = false;
  Lane& lane = *lane_;
  std::lock_guard<std::mutex> lock(lane.in_flight_mutex_);
  lane.in_flight_.reset(seq_ % kLaneSeqs);
  while (lane.oldest_in_flight_ < lane.next_seq_ &&
         !lane.in_flight_[lane.oldest_in_flight_ % kLaneSeqs])
    ++lane.oldest_in_flight_;
}

namespace {
// The error of an operation refused or aborted on a poisoned lane: PeerLost
// naming `lost` (the lane rank whose loss poisoned it), or
// CommunicatorPoisoned when there is none (-1).
std::exception_ptr poisoned_error(int lost, const std::string& what) {
  if (lost >= 0) return std::make_exception_ptr(PeerLost(lost, what, __FILE__, __LINE__));
  return std::make_exception_ptr(CommunicatorPoisoned(what, __FILE__, __LINE__));
}
}  // namespace

void Engine::take_seq_locked(Lane& lane, Operation& op, Clock::time_point now) {
  if (lane.poisoned())
    std::rethrow_exception(poisoned_error(
        lane.lost_peer_, detail::concat(op.name(), ": the communicator is poisoned (",
                                        lane.poison_reason_, ") and accepts no more operations")));
  RELAXCC_ENFORCE(!stop_, CommunicatorPoisoned, op.name(), ": the communicator is shutting down");
  if (op.collective()) {
    std::lock_guard<std::mutex> seqs(lane.in_flight_mutex_);
    const uint64_t oldest = lane.oldest_in_flight_;
    if (lane.next_seq_ - oldest >= kLaneSeqs)
      RELAXCC_THROW(CommunicationError, op.name(), " #", lane.next_seq_, ": ", kLaneSeqs,
                    " collective operations of this communicator are in flight (the oldest is #",
                    oldest, "): their tags would repeat; wait for earlier ones first");
    // With none in flight, oldest_in_flight_ is this one already.
    op.seq_ = lane.next_seq_++;
    lane.in_flight_.set(op.seq_ % kLaneSeqs);
    op.in_flight_ = true;
  } else {
    op.seq_ = lane.next_p2p_seq_++;
  }
  op.submitted_ = now;
}

void Engine::bind_work_locked(const std::shared_ptr<Lane>& lane, Operation& op,
                              const std::string& label, Details details, uint64_t submission) {
  const int tag =
      lane->poster_.collective_tag(op.seq_, Channel::header, (lane->rank_ + 1) % lane->size_);
  // A reused operation brings its last Work: reused too when nobody holds it.
  if (op.work_ && op.work_.use_count() == 1 && op.work_->is_completed()) {
    std::atomic_thread_fence(std::memory_order_acquire);  // the last holder's release
    op.work_->rebind(op, label, tag, std::move(details), submission);
  } else {
    op.work_ = std::make_shared<EngineWork>(op, label, tag, std::move(details),
                                            std::chrono::milliseconds(lane->tunables_.timeout_ms),
                                            weak_from_this(), lane, submission);
  }
}

std::shared_ptr<Work> Engine::submit(const std::shared_ptr<Lane>& lane,
                                     std::shared_ptr<Operation> op, Details details,
                                     const OpOptions& options) {
  const WorkPtr& after = options.after;
  op->set_agreement(options.agree, options.agree_what);
  std::shared_ptr<EngineWork> work;
  std::weak_ptr<Operation> waiting = op;
  bool ring = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    take_seq_locked(*lane, *op, Clock::now());
    op->lane_ = lane;
    bind_work_locked(lane, *op, options.label, std::move(details), submissions_ + 1);
    work = op->work_;
    op->after_ = after;
    queue_.push_back(std::move(op));
    signalled_.store(true, std::memory_order_seq_cst);
    const bool awaited = awaited_submission_.load(std::memory_order_relaxed) == submissions_;
    ++submissions_;
    // Callers that drive pick it up. Otherwise ring the engine thread when it
    // sleeps for good, or when nobody waited for the previous operation
    // (this caller probably does not wait either: overlap); else it watches
    // and picks the operation up within kWatchInterval, unless this caller
    // waits first, as the previous one did.
    const State state = state_.load(std::memory_order_relaxed);
    ring = drivers_.load(std::memory_order_seq_cst) == 0 && (state == State::idle || !awaited);
  }
  if (ring) doorbell_->notify();
  // Registered after the operation is queued: a dependency that already
  // completed runs the callback here, at once.
  if (after) {
    after->then([bell = doorbell_, waiting](const Work&) {
      if (auto waiter = waiting.lock()) waiter->released_.store(true, std::memory_order_release);
      bell->ring_released();
    });
  }
  return work;
}

void Engine::retire_finished() {
  // A finished protocol completes its Work at once; the operation itself (and
  // the buffers it holds) stays until the transport released every request,
  // which after a poisoning may be never ("parked").
  for (const auto& op : active_) {
    if (op->work_completed_ || !op->done() || op->computing_ > 0) continue;
    op->work_completed_ = true;
    if (!op->work_) continue;  // spawned by an operation
    record_finished(*op);
    op->report(*op->work_);
    op->work_->complete(op->error());
  }
  // Dropped operations release their tags now (one kept for reuse lives on).
  auto it =
      std::remove_if(active_.begin(), active_.end(), [](const std::shared_ptr<Operation>& op) {
        const bool drop = op->work_completed_ && op->pending_ == 0 && op->computing_ == 0;
        if (drop) op->release_seq();
        return drop;
      });
  active_.erase(it, active_.end());
}

void Engine::record_finished(const Operation& op) {
  LaneCounters::add(op.lane_->counters_.operations, 1);
  if (trace_.is_open())
    trace_event(op.name(), "op", 0, op.started_,
                detail::concat("\"seq\":", op.seq(), ",\"priority\":", op.priority(),
                               ",\"queued_us\":", micros(op.started_) - micros(op.submitted_),
                               ",\"ok\":", op.error() ? "false" : "true"));
}

bool Engine::fail_if_poisoned(Operation& op) {
  if (!op.lane_->poisoned()) return false;
  std::string reason;
  int lost = -1;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    reason = op.lane_->poison_reason_;
    lost = op.lane_->lost_peer_;
  }
  op.set_error(poisoned_error(
      lost,
      detail::concat(op.name(), " #", op.seq(), ": the communicator is poisoned (", reason, ")")));
  op.work_->complete(op.error());
  return true;
}

void Engine::fail_waiting(const Lane* lane, const std::string& reason) {
  auto it = std::stable_partition(waiting_.begin(), waiting_.end(), [&](const auto& op) {
    return lane != nullptr && op->lane_.get() != lane;
  });
  for (auto failed = it; failed != waiting_.end(); ++failed) {
    Operation& op = **failed;
    int lost = -1;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      lost = op.lane_->lost_peer_;
    }
    const std::string what = detail::concat(op.name(), " #", op.seq(), " did not start: ", reason);
    op.set_error(lost >= 0 ? std::make_exception_ptr(PeerLost(lost, what, __FILE__, __LINE__))
                           : std::make_exception_ptr(CommunicationError(what, __FILE__, __LINE__)));
    op.work_->complete(op.error());
  }
  waiting_.erase(it, waiting_.end());
}

Operation& Engine::activate(const std::shared_ptr<Operation>& op) {
  auto pos = std::find_if(active_.begin(), active_.end(),
                          [&](const auto& other) { return other->priority() < op->priority(); });
  return **active_.insert(pos, op);
}

void Engine::start(const std::shared_ptr<Operation>& op) {
  // A failed dependency: the operation fails too, and tells its peers.
  std::exception_ptr failed;
  if (op->after_) {
    if (std::exception_ptr e = op->after_->exception()) {
      failed = std::make_exception_ptr(CommunicationError(
          detail::concat(op->name(), " #", op->seq(), ": a stage it runs after failed: ",
                         op->after_->description(), ": ", abort_cause(e).reason),
          __FILE__, __LINE__));
    }
    op->after_.reset();
  }
  Operation& ref = activate(op);
  RequestPoster& t = ref.lane_->poster_;
  try {
    if (failed) {
      ref.start_failed(t, failed);
    } else {
      if (ref.prologue_) std::exchange(ref.prologue_, nullptr)();
      ref.start(t);
    }
  } catch (...) {
    ref.abort(t, std::current_exception());
  }
}

void Engine::abort_all(const Lane* lane, const std::string& reason) {
  fail_waiting(lane, detail::concat("the communicator is poisoned (", reason, ")"));
  for (const auto& op : active_) {
    if ((op->done() && op->pending_ == 0) || (lane != nullptr && op->lane_.get() != lane)) continue;
    int lost = -1;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      lost = op->lane_->lost_peer_;
    }
    auto err = poisoned_error(
        lost, detail::concat(op->name(), " #", op->seq(),
                             " aborted: the communicator is poisoned (", reason, ")"));
    try {
      op->abort(op->lane_->poster_, err);
    } catch (...) {
      RELAXCC_LOG(error, "abort of ", op->name(), " #", op->seq(), " failed");
    }
  }
}

}  // namespace relaxcc::engine
