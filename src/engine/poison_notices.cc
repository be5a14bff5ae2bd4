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

void Engine::poison(const std::shared_ptr<Lane>& lane, const std::string& reason,
                    bool notify_peers) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!poison_locked(lane, reason, notify_peers)) return;
  }
  cv_.notify_all();
}

bool Engine::poison_locked(const std::shared_ptr<Lane>& lane, const std::string& reason,
                           bool notify_peers) {
  if (lane->poisoned()) return false;
  lane->poison_reason_ = reason;
  lane->notify_peers_ = notify_peers;
  lane->poisoned_.store(true);
  to_poison_.push_back(lane);
  signalled_.store(true, std::memory_order_release);
  RELAXCC_LOG(warn, "communicator poisoned: ", reason);
  return true;
}

std::string Engine::poison_on_timeout(const std::shared_ptr<Lane>& lane, const Work& work,
                                      const std::string& reason) {
  auto report = std::make_shared<TimeoutReport>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (lane->poisoned())
      return detail::concat("the communicator was poisoned before (", lane->poison_reason_, ")");
    lane->timed_out_ = &work;
    lane->timeout_report_ = report;
    poison_locked(lane, reason, true);
  }
  cv_.notify_all();
  std::unique_lock<std::mutex> lock(report->mutex);
  report->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return report->ready; });
  return report->waiting.empty() ? std::string() : "waiting for: " + report->waiting;
}

std::shared_ptr<TimeoutReport> Engine::report_timeout(Lane& lane) {
  std::shared_ptr<TimeoutReport> report;
  const Work* work = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    report = std::exchange(lane.timeout_report_, nullptr);
    work = std::exchange(lane.timed_out_, nullptr);
  }
  if (!report) return nullptr;
  std::string waiting;
  for (const auto* ops : {&active_, &waiting_})
    for (const auto& op : *ops)
      if (op->lane_.get() == &lane && op->work_.get() == work) waiting = op->waiting_for();
  if (!waiting.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    lane.poison_reason_ += "; waiting for: " + waiting;
  }
  std::lock_guard<std::mutex> lock(report->mutex);
  report->waiting = std::move(waiting);
  return report;
}

// ---- Poison notices ------------------------------------------------------------

namespace {
bool post_listener(MPI_Comm comm, PoisonNotice* notice, MPI_Request* request) {
  *notice = PoisonNotice{};
  const int rc =
      MPI_Irecv(notice, sizeof(PoisonNotice), MPI_BYTE, MPI_ANY_SOURCE, kNoticeTag, comm, request);
  if (rc == MPI_SUCCESS) return true;
  RELAXCC_LOG(warn, "cannot listen for poison notices: ", mpi_error_string(rc));
  *request = MPI_REQUEST_NULL;
  return false;
}
}  // namespace

void Engine::poll_notices() {
  last_notice_poll_ = Clock::now();
  std::vector<std::shared_ptr<CommPair>> fresh;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fresh.swap(to_listen_);
  }
  for (auto& comms : fresh) {
    const bool known = std::any_of(listeners_.begin(), listeners_.end(),
                                   [&](const auto& l) { return l->comms == comms; });
    if (known || comms->size < 2) continue;
    auto listener = std::make_unique<Listener>();
    listener->comms = std::move(comms);
    if (post_listener(listener->comms->coll, &listener->notice, &listener->request))
      listeners_.push_back(std::move(listener));
  }
  for (auto& l : listeners_) {
    // Several notices may be waiting.
    while (l->request != MPI_REQUEST_NULL) {
      int flag = 0;
      MPI_Status status;
      const int rc = MPI_Test(&l->request, &flag, &status);
      if (rc != MPI_SUCCESS) {
        // Failed for good (MPI keeps reporting the same request): listen anew.
        RELAXCC_LOG(warn,
                    "poison-notice receive failed (posting a new one): ", mpi_error_string(rc));
        MPI_Request_free(&l->request);
        post_listener(l->comms->coll, &l->notice, &l->request);
        break;
      }
      if (!flag) break;  // (a completed request is now MPI_REQUEST_NULL)
      on_notice(*l->comms, l->notice, status.MPI_SOURCE);
      post_listener(l->comms->coll, &l->notice, &l->request);
    }
  }
  test_notice_sends();
}

void Engine::test_notice_sends() {
  // A buffer goes only with its request (an MPI_Test error leaves it
  // posted: it is freed, and the notice to that peer is lost).
  auto done = std::remove_if(notice_sends_.begin(), notice_sends_.end(), [](NoticeSend& n) {
    int flag = 0;
    if (MPI_Test(&n.request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS &&
        n.request != MPI_REQUEST_NULL)
      MPI_Request_free(&n.request);
    return n.request == MPI_REQUEST_NULL;
  });
  notice_sends_.erase(done, notice_sends_.end());
}

void Engine::on_notice(const CommPair& comms, PoisonNotice notice, int source) {
  if (notice.magic != kHeaderMagic) {
    RELAXCC_LOG(warn, "ignored a corrupt poison notice from rank ", source);
    return;
  }
  notice.reason[sizeof(notice.reason) - 1] = '\0';
  std::vector<std::shared_ptr<Lane>> hit;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& weak : lanes_) {
      auto lane = weak.lock();
      if (lane && lane->comms_.get() == &comms && lane->id_ == notice.lane && notice.origin >= 0 &&
          notice.origin < lane->size_ && notice.origin != lane->rank_ &&
          lane->comm_rank(notice.origin) == source && lane->window(notice.origin) == notice.window)
        hit.push_back(std::move(lane));
    }
  }
  for (const auto& lane : hit)
    poison(lane, detail::concat("by rank ", notice.origin, ": ", notice.reason), false);
}

void Engine::send_notices(const Lane& lane) {
  notices_sent_at_ = Clock::now();
  PoisonNotice base;
  base.lane = lane.id_;
  base.origin = lane.rank_;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    base.set_reason(lane.poison_reason_);
  }
  for (int r = 0; r < lane.size_; ++r) {
    if (r == lane.rank_) continue;
    // Per peer: the window differs.
    auto notice = std::make_shared<PoisonNotice>(base);
    notice->window = lane.window(r);
    NoticeSend send{notice, MPI_REQUEST_NULL};
    const int rc = MPI_Isend(notice.get(), sizeof(PoisonNotice), MPI_BYTE, lane.comm_rank(r),
                             kNoticeTag, lane.comms_->coll, &send.request);
    if (rc == MPI_SUCCESS)
      notice_sends_.push_back(std::move(send));
    else
      RELAXCC_LOG(warn, "cannot send a poison notice to rank ", r, ": ", mpi_error_string(rc));
  }
}

void Engine::release_listeners(bool all) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    lanes_.erase(
        std::remove_if(lanes_.begin(), lanes_.end(), [](const auto& w) { return w.expired(); }),
        lanes_.end());
    if (all) to_listen_.clear();
  }
  if (mpi_finalized()) {
    // Communicators that outlived MPI_Finalize (the application's error):
    // no MPI call any more; the buffers stay (leaked).
    if (all) {
      new std::vector<std::unique_ptr<Listener>>(std::move(listeners_));
      new std::vector<NoticeSend>(std::move(notice_sends_));
    }
    return;
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(200);
  auto unused = std::stable_partition(listeners_.begin(), listeners_.end(), [&](const auto& l) {
    return !all && l->comms.use_count() > 1;
  });
  for (auto it = unused; it != listeners_.end(); ++it) {
    Listener& l = **it;
    if (l.request == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&l.request);
    int flag = 0;
    while (MPI_Test(&l.request, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag &&
           Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (!flag) {
      RELAXCC_LOG(warn, "a poison-notice receive did not cancel; its buffer is kept (leaked)");
      new std::unique_ptr<Listener>(
          std::move(*it));  // intentional leak: the transport may still write it
    }
  }
  listeners_.erase(unused, listeners_.end());
  if (all) {
    while (!notice_sends_.empty() && Clock::now() < deadline) {
      test_notice_sends();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (!notice_sends_.empty())
      new std::vector<NoticeSend>(std::move(notice_sends_));  // intentional leak: sends in flight
  }
}

}  // namespace relaxcc::engine
