#include "src/engine/heartbeat.h"

#include <algorithm>
#include <thread>

#include "relaxcc/errors.h"
#include "relaxcc/logging.h"

namespace relaxcc::engine {

namespace {
// What heartbeats carry (static: a detached send may outlive its set): alive,
// or leaving (the set is released: no verdict on this rank any more).
constexpr uint64_t kHeartbeatPayload = 0x5442485243435852;  // "RXCCRHBT"
constexpr uint64_t kLeavingPayload = 0x4559425243435852;    // "RXCCRBYE"
// The answer to a leaving rank: the last message to it (messages between two
// ranks arrive in order, so every heartbeat sent before it was received).
constexpr uint64_t kAckPayload = 0x4b43415243435852;  // "RXCCRACK"
}  // namespace

Heartbeat::Heartbeat(std::shared_ptr<Endpoints> endpoints, std::chrono::milliseconds timeout)
    : endpoints_(std::move(endpoints)),
      transport_(endpoints_->transport()),
      timeout_(timeout),
      period_(timeout / 4),
      tag_(heartbeat_tag(endpoints_->max_tag())),
      peers_(static_cast<size_t>(endpoints_->size())),
      receives_(peers_.size(), transport_.null_request()),
      indices_(peers_.size()),
      completions_(peers_.size()) {
  for (Peer& p : peers_) p.send = transport_.null_request();
  Peer& self = peers_[static_cast<size_t>(endpoints_->rank())];
  self.lost = self.done = true;  // not a peer
}

void Heartbeat::post_receive(size_t r) {
  try {
    receives_[r] = endpoints_->irecv(Space::collective, peers_[r].beat.get(), sizeof(uint64_t),
                                     static_cast<int>(r), tag_);
  } catch (const Error& e) {
    RELAXCC_LOG(debug, "cannot listen for rank ", r, "'s heartbeats: ", e.message());
  }
}

void Heartbeat::post_receives() {
  for (size_t r = 0; r < peers_.size(); ++r)
    if (receives_[r] == transport_.null_request() && !peers_[r].lost && !peers_[r].done)
      post_receive(r);
}

void Heartbeat::poll(Clock::time_point now) {
  // Arrivals at every poll, as the notices: a message left waiting keeps a
  // transport's event fd readable, which would keep the engine thread awake.
  if (started_ == Clock::time_point{}) started_ = now;
  // Silence this rank did not watch is not its peers': after a gap of half
  // the timeout between two polls (this process descheduled or stopped, its
  // engine thread held up), every peer's clock moves on by the gap.
  if (last_poll_ != Clock::time_point{} && now - last_poll_ > timeout_ / 2) {
    const Clock::duration gap = now - last_poll_;
    started_ += gap;
    for (Peer& p : peers_)
      if (p.heard != Clock::time_point{}) p.heard += gap;
  }
  last_poll_ = now;
  take_heartbeats(now);
  if (now < next_step_) return;
  next_step_ = now + kHeartbeatStep;
  take_evidence(now);
  post_receives();
  test_sends();
  if (now >= next_send_) {
    next_send_ = now + period_;
    send_heartbeats(&kHeartbeatPayload);
  }
  if (!created_ && endpoints_->is_created()) {
    // Peers never heard from are timed from the end of the creation.
    created_ = true;
    started_ = now;
  }
  const Clock::time_point never_heard_deadline = this->never_heard_deadline();
  for (size_t r = 0; r < peers_.size(); ++r) {
    Peer& p = peers_[r];
    const bool heard = p.heard != Clock::time_point{};
    if (p.lost || (heard ? now - p.heard < timeout_ : now < never_heard_deadline)) continue;
    p.lost = true;
    const auto silent =
        std::chrono::duration_cast<std::chrono::milliseconds>(now - (heard ? p.heard : started_));
    endpoints_->fail_peer(
        static_cast<int>(r),
        detail::concat(heard ? "no heartbeat nor message for " : "no heartbeat at all in ",
                       silent.count(), " ms (RELAXCC_PEER_TIMEOUT_MS=", timeout_.count(), ")"));
  }
}

void Heartbeat::take_heartbeats(Clock::time_point now) {
  // Until none is left: a message left waiting keeps a transport's event fd
  // readable.
  for (;;) {
    int failure = 0;
    const int k = transport_.test_some(static_cast<int>(receives_.size()), receives_.data(),
                                       indices_.data(), completions_.data(), failure);
    if (failure != 0)
      RELAXCC_LOG(warn, "cannot test heartbeat receives: ", transport_.error_string(failure));
    if (k <= 0) return;
    for (int i = 0; i < k; ++i) {
      const auto r = static_cast<size_t>(indices_[static_cast<size_t>(i)]);
      const Completion& c = completions_[static_cast<size_t>(i)];
      Peer& p = peers_[r];
      if (c.cancelled) continue;
      if (c.error != 0) {
        // Posted again at the next step unless the peer is lost by then.
        RELAXCC_LOG(debug, "heartbeat receive from rank ", r,
                    " failed: ", transport_.error_string(c.error));
        continue;
      }
      p.heard = now;
      const uint64_t payload = *p.beat;
      if (payload == kLeavingPayload || payload == kAckPayload) p.done = true;
      if (payload == kLeavingPayload && !leaving_ && !p.lost) {
        // No more heartbeats to it after this answer, nor a verdict on it.
        p.lost = true;
        send_to(r, &kAckPayload, true);
      }
      // A peer's later heartbeats are taken even after a verdict on it (none
      // stays unreceived); nothing follows its leaving or its answer.
      if (!p.done) post_receive(r);
    }
  }
}

Clock::time_point Heartbeat::never_heard_deadline() const {
  const Clock::time_point plain = started_ + timeout_;
  if (created_) return plain;
  const std::optional<Clock::time_point> creation = endpoints_->creation_deadline();
  // One timeout before the creation's own: the verdict names the peer, and
  // its notice reaches the others, before their handshakes give up.
  return creation ? std::max(plain, *creation - timeout_) : plain;
}

void Heartbeat::take_evidence(Clock::time_point now) {
  for (size_t r = 0; r < peers_.size(); ++r) {
    Peer& p = peers_[r];
    const uint64_t received = endpoints_->heard_count(static_cast<int>(r));
    if (received == p.received) continue;
    p.received = received;
    p.heard = std::max(p.heard, now);
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
  // One in flight per peer: a stopped peer does not pile them up.
  for (size_t r = 0; r < peers_.size(); ++r)
    if (!peers_[r].lost && peers_[r].send == transport_.null_request()) send_to(r, payload, false);
}

void Heartbeat::send_to(size_t r, const uint64_t* payload, bool detached) {
  try {
    Request request =
        endpoints_->isend(Space::collective, payload, sizeof(*payload), static_cast<int>(r), tag_);
    // Payloads are static: a detached send may finish any time.
    if (detached)
      transport_.detach(request);
    else
      peers_[r].send = request;
  } catch (const Error& e) {
    RELAXCC_LOG(debug, "cannot send a heartbeat to rank ", r, ": ", e.message());
  }
}

void Heartbeat::forget(int rank) {
  if (rank >= 0 && rank < static_cast<int>(peers_.size()))
    peers_[static_cast<size_t>(rank)].lost = true;
}

bool Heartbeat::release(Clock::time_point deadline) {
  // Leaving: every peer still here gets kLeavingPayload and answers it (or is
  // leaving too), so no heartbeat of theirs stays unreceived (MPI reuses a
  // freed communicator's id: a message left behind would reach a later
  // communicator).
  leaving_ = true;
  test_sends();
  for (size_t r = 0; r < peers_.size(); ++r) {
    Peer& p = peers_[r];
    if (p.lost) continue;
    if (p.send != transport_.null_request()) transport_.detach(p.send);
    send_to(r, &kLeavingPayload, true);
  }
  for (;;) {
    post_receives();
    take_heartbeats(Clock::now());
    const bool answered =
        std::all_of(peers_.begin(), peers_.end(), [](const Peer& p) { return p.lost || p.done; });
    if (answered || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  for (Request& receive : receives_) transport_.cancel(receive);
  const auto posted = [&] {
    return std::any_of(receives_.begin(), receives_.end(),
                       [&](const Request& r) { return r != transport_.null_request(); });
  };
  while (posted() && Clock::now() < deadline + std::chrono::milliseconds(50)) {
    int failure = 0;
    if (transport_.test_some(static_cast<int>(receives_.size()), receives_.data(), indices_.data(),
                             completions_.data(), failure) == 0)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return !posted();
}

}  // namespace relaxcc::engine
