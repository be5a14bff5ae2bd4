// TagWindows and EndpointSet: the endpoints a set of lanes sends on, and the
// tag windows their groups hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "src/engine/op_header.h"
#include "src/engine/transport.h"

namespace relaxcc::engine {

// The tag windows (op_header.h) that the groups of one EndpointSet hold, per
// pair of ranks: this rank and each peer (comm ranks). A group takes, for
// each other member, the first window of its probe sequence (from its
// primary window) that no other group with that member holds: a live one,
// or one of the last kRetired destroyed ones of that pair, so that a
// poisoned group's late messages find no receive. Both ends of a pair see
// the same groups of that pair (both are members of each), so they choose
// alike when they create and destroy those groups in the same order; the
// choice is local, no communication. When a retired window leaves the
// pair's list, the messages from that peer still queued on its tags (the
// sequence numbers its group could have left unreceived) are received and
// dropped, so that the next group given that window never reads them.
// Bounded: per peer, the live groups and kRetired more.
class TagWindows {
 public:
  // Destroyed groups whose windows a pair keeps reserved.
  static constexpr size_t kRetired = 32;
  // The sequence numbers whose late messages a window drains: of a group
  // that failed (poisoned, or destroyed with operations in flight), its last
  // kDrainBehind (a poisoning stops the latest ones); of every group,
  // kDrainAhead past its last one (a peer that called operations this rank
  // never did).
  static constexpr uint64_t kDrainBehind = 64;
  static constexpr uint64_t kDrainAhead = 16;
  // Over `endpoints` (which outlive it).
  explicit TagWindows(Endpoints& endpoints)
      : endpoints_(endpoints),
        max_tag_(endpoints.max_tag()),
        count_(group_windows(endpoints.max_tag())) {}
  TagWindows(const TagWindows&) = delete;
  TagWindows& operator=(const TagWindows&) = delete;

  // Reserves a window for every member of `comm_members` but `me` (an index
  // into it): the result, by index (0 at `me`), is the first free window of
  // each pair from `primary` on, the rest of the probe sequence derived
  // from `identity`. Throws CommunicationError naming `group` when every
  // window of a pair is held by live groups (or when the tag space has one
  // window only and another group holds it).
  std::vector<uint32_t> reserve(const std::vector<int>& comm_members, size_t me, uint64_t primary,
                                uint64_t identity, const std::string& group);
  // The group that reserved `windows` is destroyed, its collective
  // operations numbered below `seq_end`, `failed` or not: they stay reserved
  // until kRetired more groups of the pair were destroyed, then their late
  // messages are drained (kDrainBehind, kDrainAhead); those queued already
  // are drained now when `drain_now` (a poisoned group: nothing of it
  // receives any more).
  void retire(const std::vector<int>& comm_members, size_t me, const std::vector<uint32_t>& windows,
              uint64_t seq_end, bool failed, bool drain_now);
  // What it holds (CommStats::group_windows): windows of live groups and
  // retired ones, over every pair.
  struct Counts {
    size_t live = 0, retired = 0;
  };
  Counts counts() const;

 private:
  struct Retired {
    uint32_t window;
    uint64_t seq_begin, seq_end;  // drained: [seq_begin, seq_end + kDrainAhead)
  };
  struct Pair {
    std::unordered_set<uint32_t> held;  // live and retired
    std::deque<Retired> retired;        // oldest first
  };
  // Receives and drops what comm rank `peer` sent on `r`'s tags (under mutex_).
  void drain(int peer, const Retired& r);
  mutable std::mutex mutex_;
  std::unordered_map<int, Pair> pairs_;  // by the peer's comm rank
  Endpoints& endpoints_;
  const int max_tag_;
  const uint32_t count_;  // group_windows(): windows 1..count_
};

// The endpoint set a set of lanes sends on (a communicator, its groups and
// splits: relaxcc's tags in its collective space, users' tags in its
// point-to-point space), and the tag windows its groups hold. Freed with the
// last lane that uses it.
struct EndpointSet {
  explicit EndpointSet(std::shared_ptr<Endpoints> eps);
  EndpointSet(const EndpointSet&) = delete;
  EndpointSet& operator=(const EndpointSet&) = delete;
  std::shared_ptr<Endpoints> endpoints;
  int size = 1;
  int max_tag = 32767;
  std::unique_ptr<TagWindows> windows;
};

}  // namespace relaxcc::engine
