// Allreduce: every rank's output ends with the element-wise reduction of
// every rank's input. In place when input and output are the same view;
// otherwise the two must not overlap (InvalidArgument) and the input is left
// as it was (Communicator::allreduce). Aliasing: exactly the same view, or
// no overlap at all.
//
// Algorithms:
//   ring                pipelined reduce-scatter then allgather over the ring
//                       r -> r+1, in segments of RELAXCC_SEGMENT_BYTES;
//                       bandwidth-optimal (each rank sends 2(n-1)/n of the data)
//                       (with AllreduceOptions::shares, chunk j of rank j
//                       takes its share of the tensor)
//   recursive_doubling  log2(n) rounds exchanging the whole tensor with rank
//                       r xor 2^k (non-powers of two fold the extra ranks in
//                       first); latency-optimal for small messages
// `auto` looks the message size up in the selection table
// (RELAXCC_ALLREDUCE_ALGO, "recursive_doubling:0-65536;ring:65537-" by
// default); a single algorithm name there, or AllreduceOptions::algo, forces it.
// Every rank gets bitwise identical results.
//
// Small messages on an idle communicator: a recursive-doubling allreduce
// called while nothing else runs on the communicator's engine (no operation
// in flight on any communicator that shares it, no options.after) runs on the
// calling thread at once, with the same protocol. When it completes before
// RELAXCC_SPIN_US pass without progress (busy polling where the rank has a
// CPU of its own, yields where ranks share CPUs), the call returns a Work
// that completed already: one such Work, with a generic description, is
// shared by these calls. Otherwise (a failure, a late peer) the operation
// continues as if queued, and the call returns its own Work.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "relaxcc/collectives/options.h"
#include "relaxcc/reduce_op.h"

namespace relaxcc {

enum class AllreduceAlgo : uint8_t { automatic = 0, ring = 1, recursive_doubling = 2 };

std::string_view allreduce_algo_name(AllreduceAlgo algo) noexcept;
// "auto", "ring" or "recursive_doubling". Throws InvalidArgument.
AllreduceAlgo parse_allreduce_algo(std::string_view name);

struct AllreduceOptions : OpOptions {
  ReduceOp op = ReduceOp::sum;
  AllreduceAlgo algo = AllreduceAlgo::automatic;  // automatic: the selection table
  // The ring's chunk of each rank (relaxcc/collectives/shares.h; ring_shares
  // gives them from link rates); empty: equal chunks. Every rank passes the
  // same shares (PeerMismatch otherwise). Not empty: the ring runs whatever
  // `algo` and the selection table say.
  std::vector<double> shares;
};

// Algorithm selection kept as data: size ranges in bytes mapped to algorithms.
class AllreduceSelection {
 public:
  struct Range {
    int64_t lo = 0;
    int64_t hi = INT64_MAX;  // inclusive
    AllreduceAlgo algo = AllreduceAlgo::ring;
  };
  // "recursive_doubling:0-65536;ring:65537-", or one algorithm name for all
  // sizes. Throws InvalidArgument on malformed text, gaps are allowed (ring).
  static AllreduceSelection parse(std::string_view text);
  AllreduceAlgo pick(int64_t bytes) const noexcept;
  const std::vector<Range>& ranges() const noexcept { return ranges_; }

 private:
  std::vector<Range> ranges_;
};

}  // namespace relaxcc
