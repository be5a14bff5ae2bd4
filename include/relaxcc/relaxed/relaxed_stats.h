// RelaxedStats: what the relaxed primitives (gossip, group averaging,
// asynchronous averaging, compressed allreduce) moved, accumulated over their calls, for one
// primitive: bytes per peer, rounds, and rounds that went on without a peer.
// The bytes are those the primitive's messages carry to and from each peer,
// as the transport moves them; the transport's own headers are not in them
// (CommStats counts those too). An allreduce that a primitive counts (gossip
// all, group averaging without a deadline) runs on the ring whatever the
// tensor's size, so that the bytes counted are the bytes moved (recursive
// doubling moves other bytes, to other peers).
// Thread-safe: rounds add to it from the engine thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

namespace relaxcc {

struct RelaxedCounts {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  std::vector<uint64_t> sent_to;        // per peer rank
  std::vector<uint64_t> received_from;  // per peer rank
  uint64_t rounds = 0;
  uint64_t partial_rounds = 0;        // rounds with a peer missing at the deadline
  uint64_t missed = 0;                // peer messages missing at the deadline
  std::vector<uint64_t> missed_from;  // per peer rank: its messages missing at the deadline
  // Per peer rank: rounds whose message from it said that it left this rank
  // out (it does not wait for this rank: a straggler to it).
  std::vector<uint64_t> left_out_by;
};

class RelaxedStats {
 public:
  RelaxedCounts counts() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return counts_;
  }
  // One round: `sent` bytes to each of `to`, `received` from each of `from`,
  // the peers `missing` at the deadline, and those whose message said that
  // they left this rank out.
  void add_round(const std::vector<int>& to, uint64_t sent, const std::vector<int>& from,
                 uint64_t received, const std::vector<int>& missing = {},
                 const std::vector<int>& left_out_by = {});
  // One round, no peer missing, with the bytes of each peer.
  struct Traffic {
    int peer;
    uint64_t sent, received;
  };
  void add_round(const std::vector<Traffic>& traffic);

 private:
  mutable std::mutex mutex_;
  RelaxedCounts counts_;
};

}  // namespace relaxcc
