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
                  "MPI call without the engine's progress token: only its holder may call MPI");
}
int byte_count(size_t bytes) {
  RELAXCC_ENFORCE_LE(bytes, static_cast<size_t>(INT32_MAX), InvalidArgument,
                     "one message carries at most 2^31-1 bytes");
  return static_cast<int>(bytes);
}
}  // namespace

MPI_Request RequestPoster::post_isend(const void* buf, size_t bytes, int peer, int tag, bool coll) {
  require_progress_token(engine_);
  MPI_Request req;
  check_mpi(MPI_Isend(buf, byte_count(bytes), MPI_BYTE, lane_.comm_rank(peer), tag,
                      coll ? lane_.comms_->coll : lane_.comms_->p2p, &req),
            "MPI_Isend");
  return req;
}

MPI_Request RequestPoster::post_irecv(void* buf, size_t bytes, int peer, int tag, bool coll) {
  require_progress_token(engine_);
  MPI_Request req;
  check_mpi(MPI_Irecv(buf, byte_count(bytes), MPI_BYTE, lane_.comm_rank(peer), tag,
                      coll ? lane_.comms_->coll : lane_.comms_->p2p, &req),
            "MPI_Irecv");
  return req;
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

bool RequestPoster::improbe(int peer, int tag, MPI_Message* message, size_t* bytes, bool coll) {
  require_progress_token(engine_);
  int flag = 0;
  MPI_Status status;
  check_mpi(MPI_Improbe(lane_.comm_rank(peer), tag, coll ? lane_.comms_->coll : lane_.comms_->p2p,
                        &flag, message, &status),
            "MPI_Improbe");
  if (!flag) return false;
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  *bytes = static_cast<size_t>(count);
  return true;
}

void RequestPoster::imrecv(Operation& op, int64_t slot, void* buf, size_t bytes,
                           MPI_Message* message, int peer) {
  require_progress_token(engine_);
  MPI_Request req;
  check_mpi(MPI_Imrecv(buf, byte_count(bytes), MPI_BYTE, message, &req), "MPI_Imrecv");
  engine_.add_request(op, slot, req, bytes, peer, false, true);
}

void RequestPoster::cancel_receives(Operation& op, int64_t slot) {
  require_progress_token(engine_);
  for (int i = 0; i < engine_.slots_in_use_; ++i) {
    auto& p = engine_.pending_[i];
    if (p.op == &op && p.slot == slot && p.cancellable &&
        engine_.requests_[i] != MPI_REQUEST_NULL) {
      p.cancellable = false;
      MPI_Cancel(&engine_.requests_[i]);
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
