#include "relaxcc/relaxed/adaptive_deadline.h"

#include <algorithm>
#include <cmath>

#include "relaxcc/errors.h"

namespace relaxcc {

namespace {
int64_t median(std::vector<int64_t> v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  return v[mid];
}

void push_ring(std::vector<int64_t>& ring, size_t& next, size_t window, int64_t value) {
  if (ring.size() < window) {
    ring.push_back(value);
  } else {
    ring[next] = value;
    next = (next + 1) % ring.size();
  }
}
}  // namespace

AdaptiveDeadline::AdaptiveDeadline(AdaptiveDeadlineOptions options)
    : options_(options), alive_(std::make_shared<Alive>()) {
  alive_->self = this;
  const AdaptiveDeadlineOptions& o = options_;
  RELAXCC_ENFORCE(o.k >= 0, InvalidArgument, "AdaptiveDeadline: k = ", o.k, ", expected >= 0");
  RELAXCC_ENFORCE(o.quorum > 0 && o.quorum <= 1, InvalidArgument, "AdaptiveDeadline: quorum ",
                  o.quorum, ", expected in (0, 1]");
  RELAXCC_ENFORCE(o.floor_fraction >= 0 && o.floor_fraction <= 1, InvalidArgument,
                  "AdaptiveDeadline: floor_fraction ", o.floor_fraction, ", expected in [0, 1]");
  RELAXCC_ENFORCE(o.min_floor.count() >= 0 && o.cap >= o.min_floor, InvalidArgument,
                  "AdaptiveDeadline: expected 0 <= min_floor <= cap, got min_floor ",
                  o.min_floor.count(), " us, cap ", o.cap.count(), " us");
  RELAXCC_ENFORCE(o.window >= 1 && o.straggler_misses >= 1 && o.probe_interval >= 1,
                  InvalidArgument, "AdaptiveDeadline: expected window (", o.window,
                  "), straggler_misses (", o.straggler_misses, ") and probe_interval (",
                  o.probe_interval, ") >= 1");
}

AdaptiveDeadline::~AdaptiveDeadline() {
  std::lock_guard<std::mutex> lock(alive_->mutex);
  alive_->self = nullptr;
}

AdaptiveDeadline::Guard AdaptiveDeadline::guard() {
  return [alive = alive_](const std::function<void(AdaptiveDeadline&)>& f) {
    std::lock_guard<std::mutex> lock(alive->mutex);
    if (alive->self) f(*alive->self);
  };
}

void AdaptiveDeadline::begin_round(uint64_t round, Clock::time_point start) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (round <= last_round_) return;
  if (last_round_ > 0 && start > last_start_) {
    const auto us =
        std::chrono::duration_cast<std::chrono::microseconds>(start - last_start_).count();
    push_ring(intervals_, next_interval_, static_cast<size_t>(options_.window),
              us / static_cast<int64_t>(round - last_round_));
  }
  last_round_ = round;
  last_start_ = start;
}

std::chrono::microseconds AdaptiveDeadline::floor_locked() const {
  int64_t us = options_.min_floor.count();
  if (!intervals_.empty())
    us = std::max<int64_t>(us, static_cast<int64_t>(options_.floor_fraction *
                                                    static_cast<double>(median(intervals_))));
  return std::chrono::microseconds(std::min<int64_t>(us, options_.cap.count()));
}

std::chrono::microseconds AdaptiveDeadline::current_locked() const {
  // The peers with arrivals, fastest first by their median.
  std::vector<std::pair<int64_t, const Peer*>> known;
  for (const auto& [rank, p] : peers_)
    if (!p.samples.empty()) known.emplace_back(median(p.samples), &p);
  if (known.empty()) return options_.cap;
  std::sort(known.begin(), known.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  const auto quorum =
      static_cast<size_t>(std::ceil(options_.quorum * static_cast<double>(peers_.size()) - 1e-9));
  const size_t take = std::clamp<size_t>(quorum, 1, known.size());
  std::vector<int64_t> pooled;
  for (size_t i = 0; i < take; ++i)
    pooled.insert(pooled.end(), known[i].second->samples.begin(), known[i].second->samples.end());
  const int64_t m = median(pooled);
  std::vector<int64_t> deviation(pooled.size());
  for (size_t i = 0; i < pooled.size(); ++i) deviation[i] = std::llabs(pooled[i] - m);
  const double value = static_cast<double>(m) + options_.k * static_cast<double>(median(deviation));
  const auto us = static_cast<int64_t>(std::ceil(value));
  return std::chrono::microseconds(
      std::clamp<int64_t>(us, floor_locked().count(), options_.cap.count()));
}

AdaptiveDeadline::Wait AdaptiveDeadline::wait_for(int peer, uint64_t round) {
  std::lock_guard<std::mutex> lock(mutex_);
  Peer& p = peers_[peer];
  if (round != 0 && round == p.wait_round) return p.wait;
  Wait w{current_locked(), false, {}};
  if (p.catch_up > 0) {
    w.wait = std::min(std::max(w.wait, std::chrono::microseconds(p.catch_up)), options_.cap);
    p.catch_up = 0;
  } else if (straggler_locked(p)) {
    w = Wait{std::chrono::microseconds(0), true, {}};
    if (++p.straggler_rounds % options_.probe_interval == 0) {
      const int64_t listen =
          intervals_.empty() ? options_.cap.count() : kProbeIntervals * median(intervals_);
      w.probe = std::chrono::microseconds(std::clamp<int64_t>(listen, 1, options_.cap.count()));
    }
  }
  p.wait_round = round;
  p.wait = w;
  return w;
}

std::chrono::microseconds AdaptiveDeadline::current() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_locked();
}

std::chrono::microseconds AdaptiveDeadline::floor() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return floor_locked();
}

void AdaptiveDeadline::observe(int peer, std::chrono::microseconds arrival) {
  std::lock_guard<std::mutex> lock(mutex_);
  Peer& p = peers_[peer];
  push_ring(p.samples, p.next, static_cast<size_t>(options_.window),
            std::max<int64_t>(arrival.count(), 0));
  p.misses_in_row = 0;
  p.straggler_rounds = 0;
  ++p.arrived;
}

void AdaptiveDeadline::missed(int peer, uint64_t round) {
  std::lock_guard<std::mutex> lock(mutex_);
  Peer& p = peers_[peer];
  ++p.left_out;
  if (round != 0 && round == p.miss_round) return;
  p.miss_round = round;
  ++p.misses_in_row;
}

void AdaptiveDeadline::caught_up(int peer, std::chrono::microseconds arrival) {
  std::lock_guard<std::mutex> lock(mutex_);
  Peer& p = peers_[peer];
  p.misses_in_row = 0;
  p.straggler_rounds = 0;
  // The lag, and the margin the deadline gives a peer in phase.
  p.catch_up = arrival.count() + current_locked().count();
}

bool AdaptiveDeadline::straggler(int peer) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = peers_.find(peer);
  return it != peers_.end() && straggler_locked(it->second);
}

std::vector<AdaptiveDeadline::PeerRecord> AdaptiveDeadline::peers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<PeerRecord> out;
  for (const auto& [rank, p] : peers_)
    out.push_back(PeerRecord{rank, p.arrived, p.left_out, straggler_locked(p),
                             std::chrono::microseconds(p.samples.empty() ? 0 : median(p.samples))});
  return out;
}

}  // namespace relaxcc
