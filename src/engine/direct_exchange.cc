#include "src/engine/direct_exchange.h"

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

std::shared_ptr<Work> Engine::run_now(const std::shared_ptr<Lane>& lane,
                                      const std::shared_ptr<Operation>& op, Details details,
                                      const OpOptions& options, const WorkPtr& done) {
  // A completion callback must not block (nor take a token it may hold).
  if (options.after || Engine::drives_progress_here()) return nullptr;
  op->set_agreement(options.agree, options.agree_what);
  TokenHold hold(token_, token_holder_);
  if (!hold || !active_.empty() || !waiting_.empty() || !spawned_.empty()) return nullptr;
  // Poison notices as iterate() picks them up before it starts an operation.
  auto now = Clock::now();
  if (now - last_notice_poll_ > kNoticePoll) poll_notices();
  uint64_t submission = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Anything to pick up first (a queued operation, a poisoning, a stop)
    // goes the common way, in order.
    if (signalled_.load(std::memory_order_acquire) || lane->poisoned() || stop_) return nullptr;
    take_seq_locked(*lane, *op, now);
    if (op->lane_ != lane) op->lane_ = lane;  // a reused operation has it
    // This caller waits: the next submission need not ring the engine thread.
    submission = ++submissions_;
    awaited_submission_.store(submission, std::memory_order_relaxed);
  }
  op->started_ = now;
  const Direct direct = run_direct(*lane, op, now);
  if (direct == Direct::completed) {
    record_finished(*op);
    op->work_completed_ = true;
    op->release_seq();
    return done;
  }
  if (direct == Direct::unavailable) start(op);
  RequestPoster& t = lane->poster_;
  // A short budget: a late peer must not hold the caller (who may hold
  // locks of its own) longer than the engine's busy polling would.
  const auto budget = std::chrono::microseconds(tunables_.spin_us);
  auto last_progress = now;
  // Completions drive the operation (on_complete posts what follows);
  // progress() matters after one, and while a failed operation drains.
  bool progressed = direct == Direct::adopted;
  bool idle_from_next_poll = false;
  for (;;) {
    if (progressed || op->error()) {
      try {
        op->progress(t);
      } catch (...) {
        op->abort(t, std::current_exception());
      }
    }
    progressed = false;
    test_requests(progressed);
    if (op->done() && !op->error() && op->pending_ == 0 && op->computing_ == 0 && spawned_.empty())
      break;
    // No clock reading while completions come: the budget without progress
    // runs from the first idle poll after them.
    if (progressed) {
      idle_from_next_poll = true;
      continue;
    }
    now = Clock::now();
    if (std::exchange(idle_from_next_poll, false)) last_progress = now;
    if (op->error() || signalled_.load(std::memory_order_relaxed) ||
        !pause(now - last_progress, tested_, budget)) {
      // A failure, a peer that takes its time, or something else to pick up
      // (another thread's submission): the operation goes on as if
      // submitted, with a Work of its own.
      {
        std::lock_guard<std::mutex> lock(mutex_);
        bind_work_locked(lane, *op, options.label, std::move(details), submission);
      }
      publish_counts(now);
      const WorkPtr work = op->work_;
      wake_engine(false);  // its caller may not wait
      return work;
    }
  }
  // Completed within the call: no Work of its own (a reused one stays).
  op->work_completed_ = true;
  record_finished(*op);
  active_.erase(std::find(active_.begin(), active_.end(), op));
  op->release_seq();
  return done;
}

Engine::Direct Engine::run_direct(Lane& lane, const std::shared_ptr<Operation>& op,
                                  Clock::time_point started) {
  // Traced runs show every request; a prologue or a dependency means start().
  if (trace_.is_open() || op->prologue_ || op->after_) return Direct::unavailable;
  RequestPoster& t = lane.poster_;
  DirectExchange x;
  try {
    if (!op->begin_direct(t, x)) return Direct::unavailable;
  } catch (...) {
    adopt_direct(op, x, std::current_exception());
    return Direct::adopted;
  }
  // Each request tested in turn (eager sends are complete at once): a test
  // runs the transport's progress once when its request is not complete.
  // The same back-off and budget as run_now's.
  const auto budget = std::chrono::microseconds(tunables_.spin_us);
  bool failed = false, moved_since_continue = false;
  auto last_progress = started;
  bool idle_from_next_poll = false;
  for (;;) {
    bool moved = false;
    for (int k = 0; k < x.count; ++k) {
      DirectExchange::Entry& r = x.requests[k];
      if (r.completed) continue;
      int failure = 0;
      if (!transport_->test(r.request, r.completion, failure)) {
        if (failure == 0) continue;
        // The test itself failed: the request stays the transport's, parked
        // in the table (as after a test_some failure, the lane is poisoned).
        adopt_direct(op, x);
        poison(op->lane_,
               detail::concat(op->name(), " #", op->seq(), ": ", transport_->name(),
                              " request test failed: ", transport_->error_string(failure)));
        return Direct::adopted;
      }
      r.completed = moved = moved_since_continue = true;
      failed = failed || r.completion.error != 0;
    }
    if (failed) break;
    // The operation goes on once every receive completed (sends need not
    // have: a send that waits for the peer's receive must not stop it).
    if (moved_since_continue && x.all_completed(false)) {
      moved_since_continue = false;
      Operation::DirectStep step;
      try {
        step = op->continue_direct(t, x);
      } catch (...) {
        adopt_direct(op, x, std::current_exception());
        return Direct::adopted;
      }
      if (step == Operation::DirectStep::finished) {
        RELAXCC_ENFORCE(x.all_completed(true), InternalError, op->name(),
                        ": a direct exchange finished with sends pending");
        for (int k = 0; k < x.count; ++k) count_direct(lane, x, k);
        return Direct::completed;
      }
      if (step == Operation::DirectStep::refused) break;
      moved = true;  // more: test at once what it posted
    }
    if (moved) {
      idle_from_next_poll = true;
      continue;
    }
    const auto now = Clock::now();
    if (std::exchange(idle_from_next_poll, false)) last_progress = now;
    if (signalled_.load(std::memory_order_relaxed) || !pause(now - last_progress, true, budget))
      break;
  }
  adopt_direct(op, x);
  return Direct::adopted;
}

void Engine::count_direct(Lane& lane, const DirectExchange& x, int k) {
  const DirectExchange::Entry& r = x.requests[k];
  LaneCounters& c = lane.counters_;
  const uint64_t bytes = r.send ? r.bytes : x.received(k);
  LaneCounters::add(r.send ? c.bytes_sent : c.bytes_received, bytes);
  LaneCounters::add(r.send ? c.sent_to[x.peer] : c.received_from[x.peer], bytes);
  if (!r.send) lane.comms_->endpoints->heard_from(lane.comm_rank(x.peer));
}

void Engine::adopt_direct(const std::shared_ptr<Operation>& op, DirectExchange& x,
                          std::exception_ptr error) {
  RequestPoster& t = op->lane_->poster_;
  activate(op);
  for (int k = 0; k < x.count; ++k) {
    DirectExchange::Entry& r = x.requests[k];
    if (r.completed) continue;
    const int index = add_request(*op, r.slot, std::exchange(r.request, null_request_), r.bytes,
                                  x.peer, r.send, !r.send);
    pending_[index].cancellable = !r.send;
  }
  try {
    op->leave_direct(t);
  } catch (...) {
    if (!error) error = std::current_exception();
  }
  // A failure aborts the operation where it happened, before the
  // completions that follow reach it (as on the protocol's own path).
  if (error) {
    try {
      op->abort(t, error);
    } catch (...) {
      poison(op->lane_, detail::concat(op->name(), " #", op->seq(), ": abort failed: ",
                                       abort_cause(std::current_exception()).reason));
    }
  }
  // Completed requests as test_requests hands them over; the table counted
  // the others' sends when they moved in.
  for (int k = 0; k < x.count; ++k) {
    const DirectExchange::Entry& r = x.requests[k];
    if (!r.completed) continue;
    if (r.send || r.consumed) count_direct(*op->lane_, x, k);
    if (!r.consumed) {
      // complete_request counts what it receives.
      complete_request(Pending{op.get(), r.slot, r.bytes, x.peer, r.send, !r.send, {}},
                       r.completion);
    }
  }
}

}  // namespace relaxcc::engine
