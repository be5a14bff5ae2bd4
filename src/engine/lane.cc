#include "src/engine/lane.h"

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

namespace relaxcc::engine {

Lane::Lane(Engine& engine, std::shared_ptr<EndpointSet> comms, std::vector<int> members, int rank,
           uint32_t id, std::vector<uint32_t> windows, Tunables tunables)
    : engine_(engine),
      poster_(engine, *this),
      comms_(std::move(comms)),
      members_(std::move(members)),
      rank_(rank),
      size_(members_.empty() ? comms_->size : static_cast<int>(members_.size())),
      id_(id),
      windows_(std::move(windows)),
      tunables_(std::move(tunables)),
      counters_(size_) {}

Lane::~Lane() {
  retire_windows();
}

void Lane::retire_windows() {
  if (windows_.empty() || windows_retired_.exchange(true)) return;
  uint64_t seq_end = 0;
  bool in_flight = false;
  {
    std::lock_guard<std::mutex> seqs(in_flight_mutex_);  // (next_seq_ grows under it too)
    seq_end = next_seq_;
    in_flight = oldest_in_flight_ < next_seq_;
  }
  const bool failed = poisoned();
  comms_->windows->retire(members_, static_cast<size_t>(rank_), windows_, seq_end,
                          failed || in_flight, failed);
}

std::shared_ptr<Lane> Engine::add_lane(std::shared_ptr<EndpointSet> comms, std::vector<int> members,
                                       int rank, uint32_t id, std::vector<uint32_t> windows,
                                       Tunables tunables) {
  RELAXCC_ENFORCE(&comms->endpoints->transport() == transport_.get(), InvalidArgument,
                  "a lane's endpoints (", comms->endpoints->transport().name(),
                  ") are not those of its engine's transport (", transport_->name(), ")");
  auto lane = std::make_shared<Lane>(*this, comms, std::move(members), rank, id, std::move(windows),
                                     std::move(tunables));
  std::lock_guard<std::mutex> lock(mutex_);
  // A destroyed lane's storage goes with the last weak reference: the lists
  // drop theirs as they double (not only at the next inspection).
  const auto expired = [](const std::weak_ptr<Lane>& w) { return w.expired(); };
  if (lanes_.size() + closing_.size() >= prune_at_) {
    lanes_.erase(std::remove_if(lanes_.begin(), lanes_.end(), expired), lanes_.end());
    closing_.erase(std::remove_if(closing_.begin(), closing_.end(), expired), closing_.end());
    prune_at_ = std::max<size_t>(64, 2 * (lanes_.size() + closing_.size()));
  }
  lanes_.push_back(lane);
  to_listen_.push_back(std::move(comms));
  return lane;
}

void Engine::close_lane(const std::shared_ptr<Lane>& lane) {
  lane->retire_windows();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    lane->close_deadline_ = Clock::now() + std::chrono::milliseconds(std::min<int64_t>(
                                               lane->tunables_.timeout_ms, 10000));
    closing_.push_back(lane);
  }
}

CommStats Engine::stats(const Lane& lane) const {
  const LaneCounters& c = lane.counters_;
  CommStats stats;
  stats.bytes_sent = c.bytes_sent.load(std::memory_order_relaxed);
  stats.bytes_received = c.bytes_received.load(std::memory_order_relaxed);
  stats.operations = c.operations.load(std::memory_order_relaxed);
  stats.late_messages = c.late_messages.load(std::memory_order_relaxed);
  for (const auto& n : c.sent_to) stats.sent_to.push_back(n.load(std::memory_order_relaxed));
  for (const auto& n : c.received_from)
    stats.received_from.push_back(n.load(std::memory_order_relaxed));
  stats.requests_pending = lane.requests_pending_.load(std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& weak : lanes_) stats.engine_lanes += weak.expired() ? 0 : 1;
  }
  stats.engine_operations = active_count_.load(std::memory_order_relaxed);
  const TagWindows::Counts windows = lane.comms_->windows->counts();
  stats.group_windows = static_cast<int64_t>(windows.live + windows.retired);
  return stats;
}

void Engine::expire_closed_lanes(Clock::time_point now) {
  std::vector<std::shared_ptr<Lane>> expired;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto keep =
        std::remove_if(closing_.begin(), closing_.end(), [&](const std::weak_ptr<Lane>& weak) {
          auto lane = weak.lock();
          if (!lane) return true;  // no operation holds it any more
          if (now < lane->close_deadline_) return false;
          expired.push_back(std::move(lane));
          return true;
        });
    closing_.erase(keep, closing_.end());
  }
  for (const auto& lane : expired)
    poison(lane, "the communicator was destroyed with operations in flight", false);
  release_listeners(false);
}

}  // namespace relaxcc::engine
