#include "src/protocols/alltoall_pairwise.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace relaxcc::engine {

AlltoallPairwiseOp::AlltoallPairwiseOp(std::string name, int priority, std::string label,
                                       const TensorView& input, std::vector<int64_t> send_counts,
                                       const TensorView& output, std::vector<int64_t> recv_counts,
                                       int rank, int size, int64_t part_bytes)
    : EdgeOp(std::move(name), priority, std::move(label)),
      input_(input),
      output_(output),
      send_counts_(std::move(send_counts)),
      recv_counts_(std::move(recv_counts)),
      rank_(rank),
      part_elems_(part_bytes > 0 ? std::max<int64_t>(1, part_bytes / static_cast<int64_t>(
                                                                         dtype_size(input.dtype)))
                                 : INT64_MAX) {
  OpHeader h;
  h.type = OpType::alltoall;
  h.dtype = input.dtype;
  set_header(h);
  int64_t soff = 0, roff = 0;
  for (int p = 0; p < size; ++p) {
    send_offset_.push_back(soff);
    recv_offset_.push_back(roff);
    soff += send_counts_[p];
    roff += recv_counts_[p];
  }
  for (int k = 1; k < size; ++k) {
    // Peers in the order rank+1, rank+2, ...: every rank starts with a
    // different partner.
    const int p = (rank + k) % size;
    const int64_t from = parts(recv_counts_[p]), to = parts(send_counts_[p]);
    const int index = add_peer(p, from, to, recv_counts_[p], send_counts_[p]);
    peers_.push_back({p, index});
    to_send_ += static_cast<int>(to);
    to_receive_ += static_cast<int>(from);
  }
}

void AlltoallPairwiseOp::run(RequestPoster& t) {
  const size_t esize = dtype_size(input_.dtype);
  if (!copied_) {
    copied_ = true;
    if (send_counts_[rank_] > 0)
      std::memcpy(static_cast<unsigned char*>(output_.data) + recv_offset_[rank_] * esize,
                  static_cast<const unsigned char*>(input_.data) + send_offset_[rank_] * esize,
                  static_cast<size_t>(send_counts_[rank_]) * esize);
  }
  // Throttled (a higher-priority operation is active): one send in flight.
  const bool throttled = t.throttled(*this);
  const auto part = [&](const TensorView& v, int64_t offset, int64_t count, int64_t msg) {
    const int64_t first = msg * part_elems_;
    return std::pair{static_cast<unsigned char*>(v.data) + (offset + first) * esize,
                     static_cast<size_t>(std::min(part_elems_, count - first)) * esize};
  };
  for (Peer& p : peers_) {
    const int64_t sends = parts(send_counts_[p.rank]), receives = parts(recv_counts_[p.rank]);
    while (p.sends < sends && !(throttled && posted_sends_ > sent_)) {
      const auto [buf, bytes] = part(input_, send_offset_[p.rank], send_counts_[p.rank], p.sends);
      ++posted_sends_;
      send_data(t, p.index, p.sends++, buf, bytes);
    }
    while (p.receives < receives && edge_live(p.index)) {
      const auto [buf, bytes] =
          part(output_, recv_offset_[p.rank], recv_counts_[p.rank], p.receives);
      recv_data(t, p.index, p.receives++, buf, bytes);
    }
  }
}

void AlltoallPairwiseOp::on_sent(RequestPoster&, int, int64_t) {
  ++sent_;
}
void AlltoallPairwiseOp::on_received(RequestPoster&, int, int64_t) {
  ++received_;
}

}  // namespace relaxcc::engine
