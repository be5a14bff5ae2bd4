#include "src/engine/heartbeat.h"

#include <algorithm>
#include <thread>

#include "relaxcc/errors.h"
#include "relaxcc/logging.h"

namespace relaxcc::engine {

namespace {

// Beats as tagged messages of the endpoints' own transport: one receive per
// peer, at most one `alive` in flight per peer (a stopped peer does not pile
// them up). Payloads are static: a detached send may outlive its channel.
// Messages between two ranks arrive in order, so every beat sent before an
// ack (the last message to a leaving rank) was received: none stays
// unreceived (MPI reuses a freed communicator's id: a message left behind
// would reach a later communicator).
class TransportChannel final : public LivenessChannel {
 public:
  explicit TransportChannel(std::shared_ptr<Endpoints> endpoints)
      : endpoints_(std::move(endpoints)),
        transport_(endpoints_->transport()),
        tag_(heartbeat_tag(endpoints_->max_tag())),
        peers_(static_cast<size_t>(endpoints_->size())),
        receives_(peers_.size(), transport_.null_request()),
        indices_(peers_.size()),
        completions_(peers_.size()) {
    for (Peer& p : peers_) p.send = transport_.null_request();
    Peer& self = peers_[static_cast<size_t>(endpoints_->rank())];
    self.lost = self.ignored = true;  // not a peer
  }

  void send(int rank, Beat beat) override {
    Peer& p = peers_[static_cast<size_t>(rank)];
    if (p.send != transport_.null_request()) {
      Completion completion;
      int failure = 0;
      if (!transport_.test(p.send, completion, failure) && failure != 0) transport_.detach(p.send);
    }
    if (beat == Beat::alive) {
      if (p.send == transport_.null_request()) post_send(rank, beat, false);
      return;
    }
    transport_.detach(p.send);
    post_send(rank, beat, true);
  }

  void take(const std::function<void(int, Beat)>& on_beat) override {
    post_receives();
    // Until none is left: a message left waiting keeps a transport's event
    // fd readable.
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
        if (c.cancelled) continue;
        if (c.error != 0) {
          // Posted again at the next take unless ignored by then.
          RELAXCC_LOG(debug, "heartbeat receive from rank ", r,
                      " failed: ", transport_.error_string(c.error));
          continue;
        }
        const uint64_t payload = *peers_[r].beat;
        const Beat beat = payload == static_cast<uint64_t>(Beat::leaving) ? Beat::leaving
                          : payload == static_cast<uint64_t>(Beat::ack)   ? Beat::ack
                                                                          : Beat::alive;
        on_beat(static_cast<int>(r), beat);
        // Beats from a lost peer are taken too (none stays unreceived);
        // nothing follows a leaving or an ack (the heartbeat ignores it).
        if (!peers_[r].ignored) post_receive(r);
      }
    }
  }

  void lost(int rank) override { peers_[static_cast<size_t>(rank)].lost = true; }
  void ignore(int rank) override { peers_[static_cast<size_t>(rank)].ignored = true; }

  bool close(Clock::time_point deadline) override {
    for (Peer& p : peers_) transport_.detach(p.send);
    for (Request& receive : receives_) transport_.cancel(receive);
    const auto posted = [&] {
      return std::any_of(receives_.begin(), receives_.end(),
                         [&](const Request& r) { return r != transport_.null_request(); });
    };
    while (posted() && Clock::now() < deadline) {
      int failure = 0;
      if (transport_.test_some(static_cast<int>(receives_.size()), receives_.data(),
                               indices_.data(), completions_.data(), failure) == 0)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return !posted();
  }

 private:
  struct Peer {
    Request send;          // the alive beat in flight to it (null: none)
    bool lost = false;     // no receive posted anew (one completed is reposted)
    bool ignored = false;  // no receive posted any more
    // Its receive's buffer (receives_[r]).
    std::unique_ptr<uint64_t> beat = std::make_unique<uint64_t>(0);
  };

  void post_receive(size_t r) {
    try {
      receives_[r] = endpoints_->irecv(Space::collective, peers_[r].beat.get(), sizeof(uint64_t),
                                       static_cast<int>(r), tag_);
    } catch (const Error& e) {
      RELAXCC_LOG(debug, "cannot listen for rank ", r, "'s heartbeats: ", e.message());
    }
  }
  // For every peer not lost and without one.
  void post_receives() {
    for (size_t r = 0; r < peers_.size(); ++r)
      if (receives_[r] == transport_.null_request() && !peers_[r].lost && !peers_[r].ignored)
        post_receive(r);
  }
  void post_send(int rank, Beat beat, bool detached) {
    static constexpr uint64_t kPayloads[] = {static_cast<uint64_t>(Beat::alive),
                                             static_cast<uint64_t>(Beat::leaving),
                                             static_cast<uint64_t>(Beat::ack)};
    const uint64_t* payload = beat == Beat::alive     ? &kPayloads[0]
                              : beat == Beat::leaving ? &kPayloads[1]
                                                      : &kPayloads[2];
    try {
      Request request = endpoints_->isend(Space::collective, payload, sizeof(*payload), rank, tag_);
      if (detached)
        transport_.detach(request);
      else
        peers_[static_cast<size_t>(rank)].send = request;
    } catch (const Error& e) {
      RELAXCC_LOG(debug, "cannot send a heartbeat to rank ", rank, ": ", e.message());
    }
  }

  const std::shared_ptr<Endpoints> endpoints_;
  Transport& transport_;
  const int tag_;
  std::vector<Peer> peers_;
  std::vector<Request> receives_;  // per peer: its posted receive (null: none)
  std::vector<int> indices_;       // test_some's output
  std::vector<Completion> completions_;
};

std::unique_ptr<LivenessChannel> channel_of(const std::shared_ptr<Endpoints>& endpoints) {
  std::unique_ptr<LivenessChannel> own = endpoints->liveness_channel();
  if (own) return own;
  return std::make_unique<TransportChannel>(endpoints);
}

}  // namespace

Heartbeat::Heartbeat(std::shared_ptr<Endpoints> endpoints, std::chrono::milliseconds timeout)
    : endpoints_(std::move(endpoints)),
      channel_(channel_of(endpoints_)),
      timeout_(timeout),
      period_(timeout / 4),
      peers_(static_cast<size_t>(endpoints_->size())) {
  Peer& self = peers_[static_cast<size_t>(endpoints_->rank())];
  self.lost = self.done = true;  // not a peer
}

void Heartbeat::poll(Clock::time_point now) {
  // Arrivals at every poll, as the notices: a message left waiting keeps a
  // transport's event fd readable, which would keep the engine thread awake.
  if (started_ == Clock::time_point{}) started_ = now;
  // Silence this rank did not watch is not its peers': after a gap of half
  // the timeout between two polls (this process descheduled or stopped, its
  // engine thread held up), every peer's clock moves on by the gap; at most
  // one gap per timeout, so that a rank whose polls keep stalling still
  // judges its peers.
  if (last_poll_ != Clock::time_point{} && now - last_poll_ > timeout_ / 2 &&
      (last_forgiven_ == Clock::time_point{} || now - last_forgiven_ > timeout_)) {
    last_forgiven_ = now;
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
  if (now >= next_send_) {
    next_send_ = now + period_;
    for (size_t r = 0; r < peers_.size(); ++r)
      if (!peers_[r].lost) channel_->send(static_cast<int>(r), Beat::alive);
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
    channel_->lost(static_cast<int>(r));
    const auto silent =
        std::chrono::duration_cast<std::chrono::milliseconds>(now - (heard ? p.heard : started_));
    endpoints_->fail_peer(
        static_cast<int>(r),
        detail::concat(heard ? "no heartbeat nor message for " : "no heartbeat at all in ",
                       silent.count(), " ms (RELAXCC_PEER_TIMEOUT_MS=", timeout_.count(), ")"));
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

void Heartbeat::take_heartbeats(Clock::time_point now) {
  channel_->take([&](int rank, Beat beat) { on_beat(rank, beat, now); });
}

void Heartbeat::on_beat(int rank, Beat beat, Clock::time_point now) {
  Peer& p = peers_[static_cast<size_t>(rank)];
  p.heard = now;
  if (beat == Beat::alive || p.done) return;
  p.done = true;
  channel_->ignore(rank);
  if (beat == Beat::leaving && !leaving_ && !p.lost) {
    // No more heartbeats to it after this answer, nor a verdict on it.
    p.lost = true;
    channel_->lost(rank);
    channel_->send(rank, Beat::ack);
  }
}

void Heartbeat::forget(int rank) {
  if (rank < 0 || rank >= static_cast<int>(peers_.size())) return;
  peers_[static_cast<size_t>(rank)].lost = true;
  channel_->lost(rank);
}

void Heartbeat::begin_release() {
  // Leaving: every peer still here gets a leaving beat and answers it (or is
  // leaving too), so that it stops timing this rank and no beat of its stays
  // unreceived.
  if (leaving_) return;
  leaving_ = true;
  for (size_t r = 0; r < peers_.size(); ++r)
    if (!peers_[r].lost) channel_->send(static_cast<int>(r), Beat::leaving);
}

bool Heartbeat::released(Clock::time_point now) {
  take_heartbeats(now);
  return std::all_of(peers_.begin(), peers_.end(), [](const Peer& p) { return p.lost || p.done; });
}

bool Heartbeat::close(Clock::time_point deadline) {
  return channel_->close(deadline);
}

}  // namespace relaxcc::engine
