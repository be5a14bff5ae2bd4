#include "src/engine/request_poster.h"

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

namespace relaxcc::engine {

namespace {
void require_progress_token(const Engine& e) {
  RELAXCC_ENFORCE(e.holds_token(), InternalError,
                  "a transport call without the engine's progress token: only its holder may post");
}
Space space_of(bool coll) {
  return coll ? Space::collective : Space::point_to_point;
}
}  // namespace

Request RequestPoster::post_isend(const void* buf, size_t bytes, int peer, int tag, bool coll) {
  require_progress_token(engine_);
  return lane_.comms_->endpoints->isend(space_of(coll), buf, bytes, lane_.comm_rank(peer), tag);
}

Request RequestPoster::post_irecv(void* buf, size_t bytes, int peer, int tag, bool coll) {
  require_progress_token(engine_);
  return lane_.comms_->endpoints->irecv(space_of(coll), buf, bytes, lane_.comm_rank(peer), tag);
}

void RequestPoster::isend(Operation& op, int64_t slot, const void* buf, size_t bytes, int peer,
                          int tag, bool coll) {
  engine_.add_request(op, slot, post_isend(buf, bytes, peer, tag, coll), bytes, peer, true, false);
}

void RequestPoster::irecv(Operation& op, int64_t slot, void* buf, size_t bytes, int peer, int tag,
                          bool coll) {
  const int index = engine_.add_request(op, slot, post_irecv(buf, bytes, peer, tag, coll), bytes,
                                        peer, false, true);
  engine_.pending_[index].cancellable = true;
}

bool RequestPoster::improbe(int peer, int tag, Message* message, size_t* bytes, bool coll) {
  require_progress_token(engine_);
  return lane_.comms_->endpoints->improbe(space_of(coll), lane_.comm_rank(peer), tag, message,
                                          bytes);
}

void RequestPoster::imrecv(Operation& op, int64_t slot, void* buf, size_t bytes, Message* message,
                           int peer) {
  require_progress_token(engine_);
  engine_.add_request(op, slot, lane_.comms_->endpoints->imrecv(buf, bytes, message), bytes, peer,
                      false, true);
}

void RequestPoster::cancel_receives(Operation& op, int64_t slot) {
  require_progress_token(engine_);
  for (int i = 0; i < engine_.slots_in_use_; ++i) {
    auto& p = engine_.pending_[i];
    if (p.op == &op && p.slot == slot && p.cancellable &&
        engine_.requests_[i] != engine_.null_request_) {
      p.cancellable = false;
      engine_.transport_->cancel(engine_.requests_[i]);
    }
  }
}

bool RequestPoster::throttled(const Operation& op) const {
  for (const auto& other : engine_.active_)
    if (other->priority() > op.priority() && !other->done()) return true;
  return false;
}

int RequestPoster::rank() const {
  return lane_.rank_;
}
int RequestPoster::size() const {
  return lane_.size_;
}
bool RequestPoster::poisoned() const {
  return lane_.poisoned();
}
std::string RequestPoster::error_string(int code) const {
  return engine_.transport_->error_string(code);
}
uint32_t RequestPoster::lane_id() const {
  return lane_.id_;
}
const Tunables& RequestPoster::tunables() const {
  return lane_.tunables_;
}
int RequestPoster::collective_tag(uint64_t seq, Channel channel, int peer) const {
  return engine::collective_tag(lane_.window(peer), seq, channel, lane_.comms_->max_tag);
}
ScratchPool::Buffer RequestPoster::scratch(size_t bytes) {
  return engine_.scratch_->acquire(bytes);
}
RoundStream& RequestPoster::round_stream(int peer, int tag) {
  return lane_.round_streams_[{peer, tag}];
}
void RequestPoster::spawn(const Operation& from, std::shared_ptr<Operation> op) {
  require_progress_token(engine_);
  op->lane_ = from.lane_;
  op->started_ = Clock::now();
  engine_.spawned_.push_back(std::move(op));
}
void RequestPoster::compute(Operation& op, int64_t slot, std::function<void()> fn) {
  require_progress_token(engine_);
  ++op.computing_;
  engine_.compute_.submit(&op, slot, std::move(fn));
}
void RequestPoster::count_late(uint64_t n) {
  LaneCounters::add(lane_.counters_.late_messages, n);
}

}  // namespace relaxcc::engine
