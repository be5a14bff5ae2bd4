// Alltoall(v) over point-to-point messages: each block to and from every
// other rank in messages of at most `part_bytes` (0: one message per block),
// all posted at once (receives once the edge's headers matched; sends one at
// a time while a higher-priority operation is active), and the rank's own
// block copied locally. Each edge's header carries the
// elements this rank sends the peer and expects from it, so counts that do
// not match across ranks give PeerMismatch on every rank.
#pragma once

#include <vector>

#include "src/engine/edge_op.h"

namespace relaxcc::engine {

class AlltoallPairwiseOp final : public EdgeOp {
 public:
  // Counts and displacements in elements, per rank of the lane.
  AlltoallPairwiseOp(std::string name, int priority, std::string label, const TensorView& input,
                     std::vector<int64_t> send_counts, const TensorView& output,
                     std::vector<int64_t> recv_counts, int rank, int size, int64_t part_bytes);

 private:
  void run(RequestPoster& t) override;
  void on_sent(RequestPoster& t, int pi, int64_t msg) override;
  void on_received(RequestPoster& t, int pi, int64_t msg) override;
  bool data_done() const override { return sent_ == to_send_ && received_ == to_receive_; }

  // Messages of a block of `count` elements (each at most part_elems_).
  int64_t parts(int64_t count) const { return count > 0 ? 1 + (count - 1) / part_elems_ : 0; }
  struct Peer {
    int rank;
    int index;                        // EdgeOp peer index
    int64_t sends = 0, receives = 0;  // messages posted
  };
  TensorView input_, output_;
  std::vector<int64_t> send_counts_, recv_counts_, send_offset_, recv_offset_;
  int rank_;
  int64_t part_elems_;
  std::vector<Peer> peers_;
  bool copied_ = false;
  int to_send_ = 0, to_receive_ = 0, sent_ = 0, received_ = 0, posted_sends_ = 0;
};

}  // namespace relaxcc::engine
