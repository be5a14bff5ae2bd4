// The recursive-doubling (butterfly) schedule of one rank.
//
// With p the largest power of two <= n and rem = n - p, the first 2*rem ranks
// fold in pairs: even rank r hands its data to r+1 (fold_in) and later gets
// the result back (fold_out). The p remaining ranks run log2(p) rounds,
// exchanging their whole data with the rank whose index (among the p)
// differs in bit k. Each peer appears in at most one exchange per direction.
#pragma once

#include <array>
#include <cstddef>

namespace relaxcc {

enum class ButterflyStep { fold_in_send, fold_in_recv, round, fold_out_send, fold_out_recv };

struct ButterflyMove {
  ButterflyStep kind;
  int peer;
  bool sends() const {
    return kind != ButterflyStep::fold_in_recv && kind != ButterflyStep::fold_out_recv;
  }
  bool receives() const {
    return kind != ButterflyStep::fold_in_send && kind != ButterflyStep::fold_out_send;
  }
};

// A rank's moves, in order: at most a fold in, log2(size) rounds and a fold
// out. Held inline: building one allocates nothing.
struct ButterflySchedule {
  static constexpr size_t kMaxMoves = 34;
  std::array<ButterflyMove, kMaxMoves> moves{};
  size_t count = 0;
  void push_back(ButterflyMove m) { moves[count++] = m; }
  size_t size() const { return count; }
  const ButterflyMove& operator[](size_t i) const { return moves[i]; }
  const ButterflyMove* begin() const { return moves.data(); }
  const ButterflyMove* end() const { return moves.data() + count; }
};

inline ButterflySchedule butterfly_schedule(int rank, int size) {
  ButterflySchedule moves;
  int p = 1;
  while (p * 2 <= size) p *= 2;
  const int rem = size - p;
  int newrank = rank - rem;
  if (rank < 2 * rem) {
    if (rank % 2 == 0) {
      moves.push_back({ButterflyStep::fold_in_send, rank + 1});
      moves.push_back({ButterflyStep::fold_out_recv, rank + 1});
      return moves;
    }
    moves.push_back({ButterflyStep::fold_in_recv, rank - 1});
    newrank = rank / 2;
  }
  for (int mask = 1; mask < p; mask <<= 1) {
    const int partner_new = newrank ^ mask;
    moves.push_back(
        {ButterflyStep::round, partner_new < rem ? partner_new * 2 + 1 : partner_new + rem});
  }
  if (rank < 2 * rem) moves.push_back({ButterflyStep::fold_out_send, rank - 1});
  return moves;
}

}  // namespace relaxcc
