// Broadcast over a pipelined chain: root -> root+1 -> ... -> root-1 (ranks
// mod size). The tensor moves in segments of at most segment_bytes; each rank
// forwards a segment to the next as soon as it arrived, with up to
// pipeline_depth receives in flight, so a large broadcast takes about one
// transfer time plus (size - 1) segment times. A first segment of at most
// kInlineBytes rides in the header message, so a small broadcast costs one
// message per hop.
//
// An EdgeOp: headers, mismatch detection (count, dtype, root differ:
// PeerMismatch on every rank), aborts and drains are the edge protocol's.
#pragma once

#include <vector>

#include "src/engine/edge_op.h"

namespace relaxcc::engine {

class BroadcastChainOp final : public EdgeOp {
 public:
  BroadcastChainOp(std::string name, int priority, std::string label, const TensorView& data,
                   int root, int rank, int size, int64_t segment_bytes, int pipeline_depth);

 private:
  void run(RequestPoster& t) override;
  void on_sent(RequestPoster& t, int pi, int64_t msg) override;
  void on_received(RequestPoster& t, int pi, int64_t msg) override;
  bool data_done() const override;

  // Bytes [offset, offset + length) of segment `k`.
  size_t segment_offset(int64_t k) const { return static_cast<size_t>(k) * segment_bytes_; }
  size_t segment_length(int64_t k) const;

  TensorView data_;
  size_t segment_bytes_;
  int pipeline_depth_;
  int64_t segments_ = 0;
  int left_ = -1, right_ = -1;  // peer indices; -1 at the chain's ends
  std::vector<char> arrived_;
  // received_: the segments that arrived, counted as a prefix (receives may
  // complete out of order; only a prefix can be forwarded).
  int64_t posted_in_ = 0, received_ = 0, posted_out_ = 0, sent_ = 0;
};

}  // namespace relaxcc::engine
