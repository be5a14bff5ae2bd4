// Lane: one communicator's (or group's) share of an engine, with its round
// streams and counters.
#pragma once

#include <atomic>
#include <bitset>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "relaxcc/tunables.h"
#include "relaxcc/work.h"
#include "src/collectives/scratch_pool.h"
#include "src/engine/clock.h"
#include "src/engine/op_header.h"
#include "src/engine/request_poster.h"
#include "src/engine/tag_windows.h"

namespace relaxcc::engine {

class Engine;
struct TimeoutReport;

// A round message (P2POptions::round) taken off the wire before its receive:
// kept for the receive of its round.
struct EarlyMessage {
  uint64_t round = 0;
  ScratchPool::Buffer message;
  size_t bytes = 0;
};

// The round messages from one peer with one point-to-point tag, in a lane.
// Engine thread only.
struct RoundStream {
  // The round receives waiting (each named by an address of its own), in
  // submission order: the first one takes messages.
  std::deque<const void*> receivers;
  std::deque<EarlyMessage> early;
  // The latest round whose receive was abandoned (0: none): while no receive
  // waits, a sweeper drops the stream's messages up to this round until
  // sweep_until.
  uint64_t abandoned = 0;
  Clock::time_point sweep_until{};
  bool sweeping = false;
  // Matched receives (imrecv) in flight on the stream: an abandoned
  // receive's or the sweeper's. The first receiver does not probe while
  // one is, so a message is never taken past an older one still arriving.
  int matched = 0;
};

// A lane's counters (CommStats): written only by the progress token's holder,
// read by any thread (Engine::stats) without a lock.
struct LaneCounters {
  explicit LaneCounters(int size) : sent_to(size), received_from(size) {}
  std::atomic<uint64_t> bytes_sent{0}, bytes_received{0}, operations{0}, late_messages{0};
  std::vector<std::atomic<uint64_t>> sent_to, received_from;  // per lane rank
  // One writer at a time (the token orders them): no locked instruction.
  static void add(std::atomic<uint64_t>& counter, uint64_t n) {
    counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
};

// One communicator's (or group's) share of an engine. Created by
// Engine::add_lane; operations keep their lane alive.
class Lane {
 public:
  // `windows`: a group's tag window per lane rank (TagWindows::reserve),
  // empty for a communicator (window 0).
  Lane(Engine& engine, std::shared_ptr<EndpointSet> comms, std::vector<int> members, int rank,
       uint32_t id, std::vector<uint32_t> windows, Tunables tunables);
  ~Lane();
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  uint32_t id() const { return id_; }
  const Tunables& tunables() const { return tunables_; }
  bool poisoned() const { return poisoned_.load(); }
  // Rank in the endpoint set of lane rank `r`.
  int comm_rank(int r) const { return members_.empty() ? r : members_[r]; }
  // The tag window with lane rank `r` (op_header.h).
  uint32_t window(int r) const { return windows_.empty() ? 0 : windows_[r]; }
  const std::shared_ptr<EndpointSet>& comms() const { return comms_; }
  // Gives the lane's tag windows back to the EndpointSet (as retired), once:
  // when its communicator is destroyed (Engine::close_lane), or with the
  // lane.
  void retire_windows();

 private:
  friend class Engine;
  friend class RequestPoster;
  friend class Operation;
  Engine& engine_;
  RequestPoster poster_;
  std::shared_ptr<EndpointSet> comms_;
  std::vector<int> members_;  // empty: every rank of comms_, in order
  int rank_ = 0;
  int size_ = 1;
  uint32_t id_ = 0;
  std::vector<uint32_t> windows_;  // by lane rank; empty: window 0
  std::atomic<bool> windows_retired_{false};
  Tunables tunables_;
  // Under the engine's mutex.
  uint64_t next_seq_ = 1;
  uint64_t next_p2p_seq_ = 1;
  std::string poison_reason_;
  int lost_peer_ = -1;  // the lane rank whose loss poisoned it (-1: none)
  // Written by the token's holder only.
  LaneCounters counters_;
  std::atomic<int64_t> requests_pending_{0};
  Clock::time_point close_deadline_{};  // set when its communicator is gone
  bool notify_peers_ = false;           // its poisoning started here: tell the members
  // Its poisoning started with a wait on this Work that timed out; the
  // engine thread reports what the operation still waited for.
  const Work* timed_out_ = nullptr;
  std::shared_ptr<TimeoutReport> timeout_report_;
  std::atomic<bool> poisoned_{false};
  // Engine thread only: round streams by (peer, tag).
  std::map<std::pair<int, int>, RoundStream> round_streams_;
  // Sequence numbers of the lane's collective operations not released yet
  // (submitted, and not destroyed): a new one may be at most kLaneSeqs - 1
  // past the oldest, or their tags would repeat (op_header.h). One bit per
  // sequence number of the window from oldest_in_flight_ (modulo kLaneSeqs).
  std::mutex in_flight_mutex_;
  std::bitset<kLaneSeqs> in_flight_;
  uint64_t oldest_in_flight_ = 1;  // the oldest unreleased one, or next_seq_
};

}  // namespace relaxcc::engine
