#include "alltoall_pairwise.h"

#include <cstring>

namespace relaxcc::mpi {

AlltoallPairwiseOp::AlltoallPairwiseOp(std::string name, int priority, std::string label,
                                       const TensorView& input, std::vector<int64_t> send_counts,
                                       const TensorView& output, std::vector<int64_t> recv_counts,
                                       int rank, int size)
    : EdgeOp(std::move(name), priority, std::move(label)),
      input_(input),
      output_(output),
      send_counts_(std::move(send_counts)),
      recv_counts_(std::move(recv_counts)),
      rank_(rank) {
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
    const int64_t from = recv_counts_[p] > 0 ? 1 : 0, to = send_counts_[p] > 0 ? 1 : 0;
    const int index = add_peer(p, from, to, recv_counts_[p], send_counts_[p]);
    peers_.push_back({p, index});
    to_send_ += static_cast<int>(to);
    to_receive_ += static_cast<int>(from);
  }
}

void AlltoallPairwiseOp::run(Transport& t) {
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
  for (Peer& p : peers_) {
    if (!p.send_posted && send_counts_[p.rank] > 0 && !(throttled && posted_sends_ > sent_)) {
      p.send_posted = true;
      ++posted_sends_;
      send_data(t, p.index, 0,
                static_cast<const unsigned char*>(input_.data) + send_offset_[p.rank] * esize,
                static_cast<size_t>(send_counts_[p.rank]) * esize);
    }
    if (!p.recv_posted && recv_counts_[p.rank] > 0 && edge_live(p.index)) {
      p.recv_posted = true;
      recv_data(t, p.index, 0,
                static_cast<unsigned char*>(output_.data) + recv_offset_[p.rank] * esize,
                static_cast<size_t>(recv_counts_[p.rank]) * esize);
    }
  }
}

void AlltoallPairwiseOp::on_sent(Transport&, int, int64_t) {
  ++sent_;
}
void AlltoallPairwiseOp::on_received(Transport&, int, int64_t) {
  ++received_;
}

}  // namespace relaxcc::mpi
