#include "src/protocols/recursive_doubling.h"

#include <algorithm>
#include <cstring>

#include "relaxcc/errors.h"
#include "relaxcc/kernels/reduce.h"

namespace relaxcc::engine {

RecursiveDoublingOp::RecursiveDoublingOp(std::string name, int priority, std::string label,
                                         const TensorView& data, ReduceOp op, int rank, int size,
                                         const ExecContext& ctx, int algo_id, OpType type)
    : EdgeOp(std::move(name), priority, std::move(label)),
      data_(data),
      type_(type),
      algo_id_(algo_id),
      op_(op),
      rank_(rank),
      size_(size),
      ctx_(ctx) {
  set_header(make_header());
  const Split s = split(data.nbytes());
  parts_ = s.parts;
  part_bytes_ = s.part_bytes;
  inline_first_ = part_bytes_ <= kInlineBytes;
  const ButterflySchedule moves = butterfly_schedule(rank_, size_);
  // Messages per peer, peers in rank order (at most one per move).
  struct Messages {
    int peer = -1;
    int64_t from = 0, to = 0;
  };
  std::array<Messages, ButterflySchedule::kMaxMoves> messages;
  size_t peers = 0;
  const auto find = [&](int peer) {
    return std::find_if(messages.begin(), messages.begin() + peers,
                        [&](const Messages& x) { return x.peer == peer; });
  };
  for (const ButterflyMove& m : moves) {
    auto it = find(m.peer);
    if (it == messages.begin() + peers) {
      it->peer = m.peer;
      ++peers;
    }
    if (m.receives()) it->from += parts_;
    if (m.sends()) it->to += parts_;
  }
  std::sort(messages.begin(), messages.begin() + peers,
            [](const Messages& a, const Messages& b) { return a.peer < b.peer; });
  for (size_t i = 0; i < peers; ++i) {
    const int pi = add_peer(messages[i].peer, messages[i].from, messages[i].to);
    // A later step's small message (or first part) carries the header to
    // its partner.
    if (messages[i].to > 0 && inline_first_) hold_header_for_data(pi);
  }
  for (const ButterflyMove& m : moves)
    steps_[num_steps_++] = {m, static_cast<int>(find(m.peer) - messages.begin())};
}

OpHeader RecursiveDoublingOp::make_header() const {
  OpHeader h;
  h.type = type_;
  h.dtype = data_.dtype;
  h.op = op_;
  h.algo = static_cast<uint8_t>(algo_id_);
  h.count = data_.numel;
  return h;
}

void RecursiveDoublingOp::reuse(int priority, const std::string& label, const TensorView& data,
                                ReduceOp op, const ExecContext& ctx) {
  reset_for_reuse(priority);
  reset_edges(label);
  data_ = data;
  op_ = op;
  ctx_ = ctx;
  part_bytes_ = split(data.nbytes()).part_bytes;
  set_header(make_header());
  step_ = 0;
  send_posted_ = recv_posted_ = false;
  sends_done_ = recvs_done_ = 0;
}

void RecursiveDoublingOp::run(RequestPoster& t) {
  while (step_ < num_steps_) {
    const Step& s = steps_[step_];
    const ButterflyMove& m = s.move;
    if (m.sends() && !send_posted_) {
      // The last send hands on the final result: divide once, before it.
      if (m.kind == ButterflyStep::fold_out_send && op_ == ReduceOp::avg)
        kernels::finish_average(data_, size_, ctx_);
      send_posted_ = true;
      for (int p = 0; p < parts_; ++p)
        send_data(t, s.peer_index, p, static_cast<unsigned char*>(data_.data) + part_offset(p),
                  part_size(p));
    }
    if (m.receives() && !recv_posted_) {
      if (!edge_live(s.peer_index)) return;
      // The folded-out result lands in the caller's buffer; partners' data
      // in scratch, to be combined.
      void* target = data_.data;
      if (m.kind != ButterflyStep::fold_out_recv && data_.nbytes() > 0) {
        if (theirs_.size() < data_.nbytes()) theirs_ = t.scratch(data_.nbytes());
        target = theirs_.data();
      }
      recv_posted_ = true;
      for (int p = 0; p < parts_; ++p)
        recv_data(t, s.peer_index, p, static_cast<unsigned char*>(target) + part_offset(p),
                  part_size(p));
    }
    if ((m.sends() && sends_done_ < parts_) || (m.receives() && recvs_done_ < parts_)) return;
    finish_step();
  }
}

bool RecursiveDoublingOp::begin_direct(RequestPoster& t, DirectExchange& x) {
  if (size_ != 2 || !inline_first_ || !can_exchange(t, parts_)) return false;
  std::array<Part, kMaxSplitBytes / kInlineBytes> parts;
  for (int p = 0; p < parts_; ++p)
    parts[p] = {static_cast<unsigned char*>(data_.data) + part_offset(p), part_size(p)};
  send_posted_ = true;  // the header message carries the first part
  begin_exchange(t, parts.data(), parts_, x);
  return true;
}

Operation::DirectStep RecursiveDoublingOp::continue_direct(RequestPoster& t, DirectExchange& x) {
  unsigned char* first = exchange_taken() ? exchanged_first() : exchanged_data(x, part_size(0));
  if (first == nullptr) return DirectStep::refused;
  if (parts_ > 1 && !exchange_taken()) {
    // The other parts, received as the protocol would once the header matched.
    if (theirs_.size() < data_.nbytes()) theirs_ = t.scratch(data_.nbytes());
    take_exchanged_header(x);
    recv_posted_ = true;
    for (int p = 1; p < parts_; ++p)
      receive_exchanged(t, p, theirs_.data() + part_offset(p), part_size(p), x);
    return DirectStep::more;
  }
  // The sends read the caller's buffer, which combining writes.
  if (!x.all_completed(true)) return DirectStep::more;
  const ButterflyMove& m = steps_[0].move;
  const auto first_numel = static_cast<int64_t>(part_size(0) / dtype_size(data_.dtype));
  if (parts_ > 1)
    combine(m, TensorView(theirs_.data() + part_offset(1), data_.numel - first_numel, data_.dtype),
            first_numel);
  combine(m, TensorView(first, first_numel, data_.dtype));
  if (op_ == ReduceOp::avg) kernels::finish_average(data_, size_, ctx_);
  step_ = num_steps_;
  return DirectStep::finished;
}

void RecursiveDoublingOp::leave_direct(RequestPoster& t) {
  if (!exchange_taken()) return;
  // As run() and the protocol leave it once the header matched and the
  // receives were posted: the first part delivered into theirs_.
  leave_exchange(t);
  std::memcpy(theirs_.data(), exchanged_first(), part_size(0));
  recvs_done_ = 1;
}

void RecursiveDoublingOp::combine(const ButterflyMove& m, const TensorView& theirs, int64_t first) {
  if (theirs.numel == 0) return;
  const TensorView mine = data_.slice(first, theirs.numel);
  if (m.peer < rank_) {
    kernels::reduce_into(theirs, mine, op_, ctx_);
    std::memcpy(mine.data, theirs.data, mine.nbytes());
  } else {
    kernels::reduce_into(mine, theirs, op_, ctx_);
  }
}

void RecursiveDoublingOp::finish_step() {
  const ButterflyMove& m = steps_[step_].move;
  if (m.kind == ButterflyStep::round || m.kind == ButterflyStep::fold_in_recv)
    combine(m, TensorView(theirs_.data(), data_.numel, data_.dtype));
  ++step_;
  send_posted_ = recv_posted_ = false;
  sends_done_ = recvs_done_ = 0;
  if (step_ == num_steps_ && m.kind == ButterflyStep::round && op_ == ReduceOp::avg)
    kernels::finish_average(data_, size_, ctx_);
}

void RecursiveDoublingOp::on_sent(RequestPoster& t, int, int64_t) {
  if (++sends_done_ == parts_) run(t);
}

void RecursiveDoublingOp::on_received(RequestPoster& t, int, int64_t) {
  if (++recvs_done_ == parts_) run(t);
}

}  // namespace relaxcc::engine
