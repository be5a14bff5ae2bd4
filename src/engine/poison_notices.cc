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

void Engine::poison(const std::shared_ptr<Lane>& lane, const std::string& reason, bool notify_peers,
                    int lost) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!poison_locked(lane, reason, notify_peers, lost)) return;
  }
  doorbell_->notify();
}

bool Engine::poison_locked(const std::shared_ptr<Lane>& lane, const std::string& reason,
                           bool notify_peers, int lost) {
  if (lane->poisoned()) return false;
  lane->poison_reason_ = reason;
  lane->lost_peer_ = lost;
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
  doorbell_->notify();
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
// Posts `l`'s receive of a notice from any member; false (logged) when the
// transport refuses it.
template <typename Listener>
bool post_listener(Listener& l) {
  *l.notice = PoisonNotice{};
  try {
    l.request = l.comms->endpoints->irecv(Space::collective, l.notice.get(), sizeof(PoisonNotice),
                                          kAnySource, kNoticeTag);
    l.posted = true;
  } catch (const Error& e) {
    RELAXCC_LOG(warn, "cannot listen for poison notices: ", e.message());
    l.posted = false;
  }
  return l.posted;
}
}  // namespace

void Engine::listen_to_new_sets() {
  std::vector<std::shared_ptr<EndpointSet>> fresh;
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
    if (peer_timeout_.count() > 0)
      listener->heartbeat = std::make_unique<Heartbeat>(listener->comms->endpoints, peer_timeout_);
    if (post_listener(*listener)) listeners_.push_back(std::move(listener));
  }
}

void Engine::poll_notices() {
  last_notice_poll_ = Clock::now();
  notices_polled_at_.store(last_notice_poll_.time_since_epoch().count(), std::memory_order_relaxed);
  listen_to_new_sets();
  for (auto& l : listeners_) {
    if (l->heartbeat) l->heartbeat->poll(last_notice_poll_);
    // Several notices may be waiting.
    while (l->posted) {
      Completion completion;
      int failure = 0;
      const bool done = transport_->test(l->request, completion, failure);
      if (failure != 0 || (done && completion.error != 0)) {
        // Failed for good (the transport keeps reporting the same request): listen anew.
        RELAXCC_LOG(warn, "poison-notice receive failed (posting a new one): ",
                    transport_->error_string(failure != 0 ? failure : completion.error));
        if (!done) {
          // The detached receive may still write its buffer: it keeps it for good.
          transport_->detach(l->request);
          static_cast<void>(l->notice.release());
          l->notice = std::make_unique<PoisonNotice>();
        }
        post_listener(*l);
        break;
      }
      if (!done) break;
      l->posted = false;
      on_notice(*l->comms, *l->notice, completion.source);
      post_listener(*l);
    }
  }
  poll_releasing(last_notice_poll_);
  test_notice_sends();
  if (transport_->peer_errors_pending()) on_peer_errors();
}

void Engine::on_peer_errors() {
  for (const PeerError& e : transport_->take_peer_errors()) {
    for (auto& l : listeners_)
      if (l->heartbeat && l->comms->endpoints.get() == e.endpoints) l->heartbeat->forget(e.rank);
    for (auto& r : releasing_)
      if (r.listener->comms->endpoints.get() == e.endpoints) r.listener->heartbeat->forget(e.rank);
    std::vector<std::shared_ptr<Lane>> hit;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& weak : lanes_) {
        auto lane = weak.lock();
        if (lane && lane->comms_->endpoints.get() == e.endpoints && !lane->poisoned())
          hit.push_back(std::move(lane));
      }
    }
    for (const auto& lane : hit) {
      int peer = -1;  // the lost rank's lane rank
      for (int r = 0; r < lane->size_ && peer < 0; ++r)
        if (lane->comm_rank(r) == e.rank) peer = r;
      if (peer < 0 || peer == lane->rank_) continue;
      const std::string reason = detail::concat("rank ", peer, " is lost: ", e.reason);
      // Its operations fail with PeerLost before the poisoning aborts them.
      for (const auto& op : active_) {
        if (op->lane_ != lane || (op->done() && op->pending_ == 0)) continue;
        try {
          op->abort(lane->poster_,
                    std::make_exception_ptr(
                        PeerLost(peer, detail::concat(op->name(), " #", op->seq(), ": ", reason),
                                 __FILE__, __LINE__)));
        } catch (...) {
          RELAXCC_LOG(error, "abort of ", op->name(), " #", op->seq(), " failed");
        }
      }
      poison(lane, reason, true, peer);
    }
  }
}

void Engine::test_notice_sends() {
  // A buffer goes only with its request (a failed test leaves it posted: it
  // is detached, and the notice to that peer is lost).
  auto done = std::remove_if(notice_sends_.begin(), notice_sends_.end(), [&](NoticeSend& n) {
    Completion completion;
    int failure = 0;
    if (transport_->test(n.request, completion, failure)) return true;
    if (failure == 0) return false;
    transport_->detach(n.request);
    return true;
  });
  notice_sends_.erase(done, notice_sends_.end());
}

void Engine::on_notice(const EndpointSet& comms, PoisonNotice notice, int source) {
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
  for (const auto& lane : hit) {
    const bool lost = notice.lost >= 0 && notice.lost < lane->size_ && notice.lost != lane->rank_;
    poison(lane, detail::concat("by rank ", notice.origin, ": ", notice.reason), false,
           lost ? notice.lost : -1);
  }
}

void Engine::send_notices(const Lane& lane) {
  notices_sent_at_ = Clock::now();
  PoisonNotice base;
  base.lane = lane.id_;
  base.origin = lane.rank_;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    base.set_reason(lane.poison_reason_);
    base.lost = lane.lost_peer_;
  }
  for (int r = 0; r < lane.size_; ++r) {
    if (r == lane.rank_) continue;
    // Per peer: the window differs.
    auto notice = std::make_shared<PoisonNotice>(base);
    notice->window = lane.window(r);
    try {
      const Request request = lane.comms_->endpoints->isend(
          Space::collective, notice.get(), sizeof(PoisonNotice), lane.comm_rank(r), kNoticeTag);
      notice_sends_.push_back(NoticeSend{notice, request});
    } catch (const Error& e) {
      RELAXCC_LOG(warn, "cannot send a poison notice to rank ", r, ": ", e.message());
    }
  }
}

void Engine::finish_listener(std::unique_ptr<Listener> listener, Clock::time_point deadline) {
  Listener& l = *listener;
  const bool heartbeat_closed = !l.heartbeat || l.heartbeat->close(deadline);
  bool done = !l.posted;
  if (l.posted) {
    transport_->cancel(l.request);
    Completion completion;
    int failure = 0;
    while (!(done = transport_->test(l.request, completion, failure)) && failure == 0 &&
           Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  if (!done || !heartbeat_closed) {
    RELAXCC_LOG(warn,
                "a poison-notice or heartbeat receive did not cancel; its buffer is kept (leaked)");
    static_cast<void>(listener.release());  // intentional leak: the transport may still write it
  }
}

void Engine::poll_releasing(Clock::time_point now) {
  if (releasing_.empty() || transport_->closed()) return;  // closed: release_listeners leaks them
  for (auto it = releasing_.begin(); it != releasing_.end();) {
    Listener& l = *it->listener;
    // A notice to a set that left is taken and dropped: none stays
    // unreceived.
    Completion completion;
    int failure = 0;
    if (l.posted && transport_->test(l.request, completion, failure)) post_listener(l);
    if (l.heartbeat->released(now) || now >= it->deadline) {
      finish_listener(std::move(it->listener), now + std::chrono::milliseconds(50));
      it = releasing_.erase(it);
    } else {
      ++it;
    }
  }
}

void Engine::release_listeners(bool all) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    lanes_.erase(
        std::remove_if(lanes_.begin(), lanes_.end(), [](const auto& w) { return w.expired(); }),
        lanes_.end());
  }
  // A set never listened to yet is listened to now, so that it takes its
  // peers' beats and tells them it leaves like every other set: a peer
  // whose engine listened to it sent beats that would otherwise stay
  // unreceived.
  if (all && !transport_->closed()) listen_to_new_sets();
  if (transport_->closed()) {
    // Communicators that outlived their transport (MPI finalized: the
    // application's error): no call any more; the buffers stay (leaked).
    if (all) {
      new std::vector<std::unique_ptr<Listener>>(std::move(listeners_));
      new std::vector<Releasing>(std::move(releasing_));
      new std::vector<NoticeSend>(std::move(notice_sends_));
    }
    return;
  }
  const auto now = Clock::now();
  const auto deadline = now + std::chrono::milliseconds(200);
  auto unused = std::stable_partition(listeners_.begin(), listeners_.end(), [&](const auto& l) {
    return !all && l->comms.use_count() > 1;
  });
  for (auto it = unused; it != listeners_.end(); ++it) {
    Heartbeat* heartbeat = (*it)->heartbeat.get();
    if (heartbeat) heartbeat->begin_release();
    if (heartbeat && !heartbeat->released(now))
      releasing_.push_back(Releasing{
          std::move(*it), now + std::min<Clock::duration>(peer_timeout_, kMaxReleaseWait)});
    else
      finish_listener(std::move(*it), deadline);
  }
  listeners_.erase(unused, listeners_.end());
  if (all) {
    // The engine ends: the released sets get a bounded wait for their peers'
    // answers (a peer that already left answers at once).
    const auto wait = std::clamp<Clock::duration>(peer_timeout_ / 2, std::chrono::milliseconds(200),
                                                  std::chrono::milliseconds(2000));
    const auto until = now + wait;
    for (Releasing& r : releasing_) r.deadline = std::min(r.deadline, until);
    while (!releasing_.empty() && !transport_->closed()) {
      poll_releasing(Clock::now());
      if (!releasing_.empty()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
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
