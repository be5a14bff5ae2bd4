#include "src/engine/engine.h"

#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <sstream>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "relaxcc/logging.h"
#include "src/engine/engine_detail.h"
#include "src/engine/engine_work.h"

namespace relaxcc::engine {

int Engine::add_request(Operation& op, int64_t slot, Request req, size_t bytes, int peer, bool send,
                        bool recv) {
  int index;
  if (!free_slots_.empty()) {
    std::pop_heap(free_slots_.begin(), free_slots_.end(), std::greater<>());
    index = free_slots_.back();
    free_slots_.pop_back();
  } else {
    index = static_cast<int>(requests_.size());
    requests_.push_back(null_request_);
    pending_.emplace_back();
    indices_.resize(requests_.size());
    completions_.resize(requests_.size());
  }
  requests_[index] = req;
  slots_in_use_ = std::max(slots_in_use_, index + 1);
  pending_[index] = Pending{
      &op, slot, bytes, peer, send, recv, trace_.is_open() ? Clock::now() : Clock::time_point{}};
  ++num_pending_;
  ++op.pending_;
  op.lane_->requests_pending_.fetch_add(1, std::memory_order_relaxed);
  if (send) {
    LaneCounters& c = op.lane_->counters_;
    LaneCounters::add(c.bytes_sent, bytes);
    LaneCounters::add(c.sent_to[peer], bytes);
  }
  return index;
}

void Engine::test_requests(bool& progressed) {
  tested_ = num_pending_ > 0;
  if (num_pending_ == 0) return;
  int failure = 0;
  const int outcount = transport_->test_some(slots_in_use_, requests_.data(), indices_.data(),
                                             completions_.data(), failure);
  if (failure != 0) {
    const std::string reason = detail::concat(
        transport_->name(), " request test failed: ", transport_->error_string(failure));
    std::vector<std::shared_ptr<Lane>> lanes;
    for (const auto& op : active_) lanes.push_back(op->lane_);
    for (const auto& lane : lanes) poison(lane, reason);
    abort_all(nullptr, reason);
    return;
  }
  if (outcount == 0) return;
  progressed = true;
  for (int k = 0; k < outcount; ++k) {
    const int index = indices_[k];
    const Pending p = pending_[index];
    // A copy: on_complete may post requests, and add_request may grow completions_.
    const Completion completion = completions_[k];
    requests_[index] = null_request_;
    pending_[index] = Pending{};
    free_slots_.push_back(index);
    std::push_heap(free_slots_.begin(), free_slots_.end(), std::greater<>());
    --num_pending_;
    --p.op->pending_;
    p.op->lane_->requests_pending_.fetch_sub(1, std::memory_order_relaxed);
    complete_request(p, completion);
  }
  while (slots_in_use_ > 0 && requests_[slots_in_use_ - 1] == null_request_) --slots_in_use_;
}

void Engine::complete_request(const Pending& p, const Completion& completion) {
  if (p.recv && completion.error == 0 && !completion.cancelled) {
    Lane& lane = *p.op->lane_;
    lane.comms_->endpoints->heard_from(lane.comm_rank(p.peer));
    LaneCounters& c = lane.counters_;
    LaneCounters::add(c.bytes_received, completion.bytes);
    LaneCounters::add(c.received_from[p.peer], completion.bytes);
  }
  if (trace_.is_open() && (p.send || p.recv))
    trace_event(p.send ? "send" : "recv", "transport", p.send ? 1 : 2, p.posted,
                detail::concat("\"peer\":", p.peer, ",\"bytes\":", p.bytes, ",\"op\":\"",
                               p.op->name(), "\",\"seq\":", p.op->seq()));
  try {
    p.op->on_complete(p.op->lane_->poster_, p.slot, completion);
  } catch (...) {
    // An abort that fails (a send it posts throws) must not lose the other
    // completions of this batch: their requests are freed already.
    try {
      p.op->abort(p.op->lane_->poster_, std::current_exception());
    } catch (...) {
      poison(p.op->lane_, detail::concat(p.op->name(), " #", p.op->seq(), ": abort failed: ",
                                         abort_cause(std::current_exception()).reason));
    }
  }
  // The transport gave up on a peer (a lost connection, a dead process):
  // nothing more on this lane can be trusted to complete.
  if (completion.error != 0 && p.peer >= 0)
    poison(p.op->lane_,
           detail::concat(p.op->name(), " #", p.op->seq(), ": transport error with rank ", p.peer,
                          ": ", transport_->error_string(completion.error)),
           true, p.peer);
}

}  // namespace relaxcc::engine
