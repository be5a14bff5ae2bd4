#include "src/protocols/broadcast_chain.h"

#include <algorithm>

namespace relaxcc::engine {

BroadcastChainOp::BroadcastChainOp(std::string name, int priority, std::string label,
                                   const TensorView& data, int root, int rank, int size,
                                   int64_t segment_bytes, int pipeline_depth)
    : EdgeOp(std::move(name), priority, std::move(label)),
      data_(data),
      segment_bytes_(static_cast<size_t>(std::max<int64_t>(segment_bytes, 1))),
      pipeline_depth_(std::max(pipeline_depth, 1)) {
  OpHeader h;
  h.type = OpType::broadcast;
  h.dtype = data.dtype;
  h.count = data.numel;
  h.root = root;
  set_header(h);
  segments_ = static_cast<int64_t>((data.nbytes() + segment_bytes_ - 1) / segment_bytes_);
  arrived_.assign(static_cast<size_t>(segments_), 0);
  const int position = (rank - root + size) % size;
  if (position > 0) left_ = add_peer((rank - 1 + size) % size, segments_, 0);
  if (position < size - 1) {
    right_ = add_peer((rank + 1) % size, 0, segments_);
    // A small first segment carries the header to the next rank.
    if (left_ >= 0 && segments_ > 0 && segment_length(0) <= kInlineBytes)
      hold_header_for_data(right_);
  }
}

size_t BroadcastChainOp::segment_length(int64_t k) const {
  return std::min(segment_bytes_, data_.nbytes() - segment_offset(k));
}

void BroadcastChainOp::run(RequestPoster& t) {
  auto* bytes = static_cast<unsigned char*>(data_.data);
  // The root has every segment; the others forward what arrived.
  const int64_t available = left_ < 0 ? segments_ : received_;
  const int64_t window = t.throttled(*this) ? 1 : pipeline_depth_;
  while (right_ >= 0 && posted_out_ < available && posted_out_ - sent_ < window) {
    send_data(t, right_, posted_out_, bytes + segment_offset(posted_out_),
              segment_length(posted_out_));
    ++posted_out_;
  }
  if (left_ < 0 || !edge_live(left_)) return;
  while (posted_in_ < segments_ && posted_in_ - received_ < window) {
    recv_data(t, left_, posted_in_, bytes + segment_offset(posted_in_), segment_length(posted_in_));
    ++posted_in_;
  }
}

void BroadcastChainOp::on_sent(RequestPoster& t, int, int64_t) {
  ++sent_;
  run(t);
}

void BroadcastChainOp::on_received(RequestPoster& t, int, int64_t msg) {
  arrived_[static_cast<size_t>(msg)] = 1;
  while (received_ < segments_ && arrived_[static_cast<size_t>(received_)]) ++received_;
  run(t);
}

bool BroadcastChainOp::data_done() const {
  return (left_ < 0 || received_ == segments_) && (right_ < 0 || sent_ == segments_);
}

}  // namespace relaxcc::engine
