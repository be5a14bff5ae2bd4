// TrafficCounter: a communicator that counts the bytes its transport sends
// for it and for every communicator made from it (group(), split(),
// split_node_local(), and theirs in turn), while they live and after they
// are released; everything else forwards to the communicator it wraps,
// stats() included (that one's own CommStats). A communicator's CommStats
// count only its own traffic: rounds that run on groups of the
// communicator an algorithm was given (group_average without a deadline,
// as in moshpit_sgd:no-deadline), hierarchy levels (split) and the
// Reducer's agreements (its split) move bytes that the given
// communicator's counters never see.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <utility>
#include <vector>

#include "relaxcc/forwarding_communicator.h"

namespace relaxcc {

class TrafficCounter final : public ForwardingCommunicator {
 public:
  // Counts what `inner` and the communicators made from this counter send
  // from now on: bytes_sent() starts at 0. Traffic on host_communicator()
  // (a device communicator's host side) is not counted.
  explicit TrafficCounter(CommunicatorPtr inner)
      : TrafficCounter(std::move(inner), std::make_shared<Shared>()) {}
  ~TrafficCounter() override {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->released += sent();
    shared_->live.erase(this);
  }
  TrafficCounter(const TrafficCounter&) = delete;
  TrafficCounter& operator=(const TrafficCounter&) = delete;

  // Bytes sent by the transport since the root counter was created, over
  // the root's communicator and every communicator made from it or from
  // one of those, released or not. Counted as each message or segment is
  // posted; exact once their operations completed.
  uint64_t bytes_sent() const {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    uint64_t bytes = shared_->released;
    for (const TrafficCounter* c : shared_->live) bytes += c->sent();
    return bytes;
  }

  std::shared_ptr<Communicator> group(const std::vector<int>& members,
                                      const GroupOptions& options) override {
    return counted(inner_->group(members, options));
  }
  std::shared_ptr<Communicator> split(int color, int key, const SplitOptions& options) override {
    return counted(inner_->split(color, key, options));
  }
  std::shared_ptr<Communicator> split_node_local(const SplitOptions& options) override {
    return counted(inner_->split_node_local(options));
  }

 private:
  // What one tree of counters shares: the live ones, and what the released
  // ones had sent when they were released.
  struct Shared {
    std::mutex mutex;
    std::unordered_set<const TrafficCounter*> live;
    uint64_t released = 0;
  };

  TrafficCounter(CommunicatorPtr inner, std::shared_ptr<Shared> shared)
      : ForwardingCommunicator(std::move(inner)),
        shared_(std::move(shared)),
        start_(inner_->stats().bytes_sent) {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->live.insert(this);
  }

  // What inner_ sent since this counter was made.
  uint64_t sent() const { return inner_->stats().bytes_sent - start_; }

  // A made communicator (null for a split with a negative color), counted.
  CommunicatorPtr counted(CommunicatorPtr made) {
    if (!made) return nullptr;
    return std::shared_ptr<TrafficCounter>(new TrafficCounter(std::move(made), shared_));
  }

  std::shared_ptr<Shared> shared_;
  uint64_t start_;
};

}  // namespace relaxcc
