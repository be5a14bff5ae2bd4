#include "src/engine/heartbeat.h"

#include <thread>

#include "relaxcc/errors.h"
#include "relaxcc/logging.h"

namespace relaxcc::engine {

namespace {
// What heartbeats carry (static: a detached send may outlive its set): alive,
// or leaving (the set is released: no verdict on this rank any more).
constexpr uint64_t kHeartbeatPayload = 0x5442485243435852;  // "RXCCRHBT"
constexpr uint64_t kLeavingPayload = 0x4559425243435852;    // "RXCCRBYE"
}  // namespace

std::chrono::milliseconds checked_peer_timeout(int64_t ms) {
  RELAXCC_ENFORCE(ms == 0 || (ms >= 200 && ms <= 600000), InvalidArgument,
                  "RELAXCC_PEER_TIMEOUT_MS=", ms, ": expected 0 (off) or 200 to 600000");
  return std::chrono::milliseconds(ms);
}

Heartbeat::Heartbeat(std::shared_ptr<Endpoints> endpoints, std::chrono::milliseconds timeout)
    : endpoints_(std::move(endpoints)),
      transport_(endpoints_->transport()),
      timeout_(timeout),
      period_(timeout / 4),
      tag_(heartbeat_tag(endpoints_->max_tag())),
      peers_(static_cast<size_t>(endpoints_->size())),
      receive_(transport_.null_request()) {
  for (Peer& p : peers_) p.send = transport_.null_request();
  peers_[static_cast<size_t>(endpoints_->rank())].lost = true;  // not a peer
}

void Heartbeat::post_receive() {
  try {
    receive_ =
        endpoints_->irecv(Space::collective, &received_, sizeof(received_), kAnySource, tag_);
    posted_ = true;
  } catch (const Error& e) {
    RELAXCC_LOG(warn, "cannot listen for heartbeats: ", e.message());
    posted_ = false;
  }
}

void Heartbeat::poll(Clock::time_point now) {
  if (now < next_step_) return;
  next_step_ = now + kHeartbeatStep;
  if (!posted_) post_receive();
  take_heartbeats(now);
  test_sends();
  if (now >= next_send_) {
    next_send_ = now + period_;
    send_heartbeats(&kHeartbeatPayload);
  }
  for (size_t r = 0; r < peers_.size(); ++r) {
    Peer& p = peers_[r];
    if (p.lost || p.heard == Clock::time_point{} || now - p.heard < timeout_) continue;
    p.lost = true;
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - p.heard);
    endpoints_->fail_peer(static_cast<int>(r),
                          detail::concat("no heartbeat for ", silent.count(),
                                         " ms (RELAXCC_PEER_TIMEOUT_MS=", timeout_.count(), ")"));
  }
}

void Heartbeat::take_heartbeats(Clock::time_point now) {
  while (posted_) {
    Completion completion;
    int failure = 0;
    const bool done = transport_.test(receive_, completion, failure);
    if (failure != 0 || (done && completion.error != 0)) {
      RELAXCC_LOG(warn, "heartbeat receive failed (posting a new one): ",
                  transport_.error_string(failure != 0 ? failure : completion.error));
      if (!done) transport_.detach(receive_);  // received_ stays this object's: never freed early
      post_receive();
      return;
    }
    if (!done) return;
    if (completion.source >= 0 && completion.source < static_cast<int>(peers_.size())) {
      Peer& p = peers_[static_cast<size_t>(completion.source)];
      p.heard = now;
      p.lost = p.lost || received_ == kLeavingPayload;
    }
    post_receive();
  }
}

void Heartbeat::test_sends() {
  for (Peer& p : peers_) {
    if (p.send == transport_.null_request()) continue;
    Completion completion;
    int failure = 0;
    if (!transport_.test(p.send, completion, failure) && failure != 0) transport_.detach(p.send);
  }
}

void Heartbeat::send_heartbeats(const uint64_t* payload) {
  for (size_t r = 0; r < peers_.size(); ++r) {
    Peer& p = peers_[r];
    // One in flight per peer: a stopped peer does not pile them up.
    if (p.lost || p.send != transport_.null_request()) continue;
    try {
      p.send = endpoints_->isend(Space::collective, payload, sizeof(*payload), static_cast<int>(r),
                                 tag_);
    } catch (const Error& e) {
      RELAXCC_LOG(debug, "cannot send a heartbeat to rank ", r, ": ", e.message());
    }
  }
}

void Heartbeat::forget(int rank) {
  if (rank >= 0 && rank < static_cast<int>(peers_.size()))
    peers_[static_cast<size_t>(rank)].lost = true;
}

bool Heartbeat::release(Clock::time_point deadline) {
  if (posted_) transport_.cancel(receive_);
  // The peers stop timing this rank (those with a heartbeat in flight miss
  // it and, should they keep the set, may report this rank later).
  test_sends();
  send_heartbeats(&kLeavingPayload);
  for (;;) {
    bool pending = false;
    if (posted_) {
      Completion completion;
      int failure = 0;
      if (transport_.test(receive_, completion, failure) || failure != 0)
        posted_ = false;
      else
        pending = true;
    }
    test_sends();
    for (const Peer& p : peers_) pending = pending || p.send != transport_.null_request();
    if (!pending || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  // Sends carry the static payload: detached ones may finish any time.
  for (Peer& p : peers_)
    if (p.send != transport_.null_request()) transport_.detach(p.send);
  return !posted_;
}

}  // namespace relaxcc::engine
