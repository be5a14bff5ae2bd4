// Shares: how a reduce-scatter schedule splits a tensor over its ranks when
// their links differ (docs/algorithms.md, "Bandwidth-balanced shares").
//
// A share vector holds one non-negative weight per rank (in rank order, not
// all zero); rank j owns the j-th of `size` consecutive shards, of about
// numel * shares[j] / sum(shares) elements. Empty: equal shares (the
// default). Every rank of a collective must pass identical shares: the ring
// and the owner schedules carry the shard layout in their headers, so ranks
// whose shares differ fail with PeerMismatch instead of mixing shards.
//
// From link rates (one per rank, any unit, each > 0; the rate of the rank's
// host link in each direction, as bench/relaxcc-hosts shapes it):
//   owner_shares  the direct (owner) schedule: every rank sends each owner
//                 its piece of the owner's shard, and each owner sends its
//                 reduced shard to every rank, so rank j moves
//                 (1 + (n-2) f_j) of the tensor each way. The shares
//                 minimize max_j (1 + (n-2) f_j) / rate_j (water filling:
//                 a rank too slow to carry its own sends owns nothing).
//   ring_shares   the ring r -> r+1: link j -> j+1 carries 2 - f_j - f_{j+1}
//                 of the tensor at min(rate_j, rate_{j+1}); the shares
//                 minimize the slowest link's time.
// Both give equal shares when every rate is the same (and when two ranks
// or fewer make the owner schedule's time independent of the shares).
#pragma once

#include <cstdint>
#include <vector>

namespace relaxcc {

std::vector<double> owner_shares(const std::vector<double>& rates);
std::vector<double> ring_shares(const std::vector<double>& rates);

// The elements of each rank's shard: numel split by `shares` (largest
// remainder, ties to the lower rank; identical on every rank for identical
// shares), or equally (the first numel % size shards one more) when shares
// is empty. InvalidArgument for shares of another size than `size`, a
// negative or non-finite weight, or weights that are all zero.
std::vector<int64_t> shard_counts(int64_t numel, int size, const std::vector<double>& shares);

}  // namespace relaxcc
