#include "ring.h"

#include <algorithm>
#include <cstring>

#include "relaxcc/errors.h"
#include "relaxcc/kernels/reduce.h"

namespace relaxcc::mpi {

namespace {
uint64_t layout_hash(const std::vector<int64_t>& counts, int64_t segment_elems) {
  uint64_t h = 14695981039346656037ull;
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (int64_t c : counts) mix(static_cast<uint64_t>(c));
  mix(static_cast<uint64_t>(segment_elems));
  return h;
}
}  // namespace

RingOp::RingOp(std::string name, int priority, std::string label, RingSpec spec, int rank, int size,
               const ExecContext& ctx, std::unique_ptr<ChunkCodec> codec)
    : EdgeOp(std::move(name), priority, std::move(label)),
      spec_(std::move(spec)),
      rank_(rank),
      size_(size),
      ctx_(ctx),
      codec_(std::move(codec)) {
  RELAXCC_ENFORCE(size_ >= 2, InternalError, "ring needs 2 or more ranks");
  RELAXCC_ENFORCE_EQ(static_cast<int>(spec_.chunk_counts.size()), size_, InternalError, "ring chunks");
  // The ring keeps partial sums in the received wire buffer. Codecs that
  // decode into a separate accumulator need an acc buffer per slot as well.
  RELAXCC_ENFORCE(codec_->in_place(), Unsupported, "ring with codec '", codec_->name(),
                  "': only in-place codecs are supported by this ring");
  const int64_t esize = static_cast<int64_t>(dtype_size(spec_.dtype));
  segment_elems_ = std::max<int64_t>(1, spec_.segment_bytes / esize);
  wire_bytes_ = codec_->wire_bytes(segment_elems_, spec_.dtype);
  chunk_offset_.resize(size_);
  int64_t total = 0;
  for (int c = 0; c < size_; ++c) {
    chunk_offset_[c] = total;
    total += spec_.chunk_counts[c];
  }
  build_schedule();

  OpHeader h;
  h.type = spec_.type;
  h.dtype = spec_.dtype;
  h.op = spec_.reduce_phase ? spec_.op : ReduceOp::sum;
  h.algo = static_cast<uint8_t>(spec_.algo_id);
  h.count = total;
  h.layout = layout_hash(spec_.chunk_counts, segment_elems_);
  set_header(h);

  const int left_rank = (rank_ - 1 + size_) % size_, right_rank = (rank_ + 1) % size_;
  const int64_t n_in = static_cast<int64_t>(in_.size()), n_out = static_cast<int64_t>(out_.size());
  if (left_rank == right_rank) {
    left_ = right_ = add_peer(left_rank, n_in, wire_bytes_, n_out);
  } else {
    left_ = add_peer(left_rank, n_in, wire_bytes_, 0);
    right_ = add_peer(right_rank, 0, 0, n_out);
  }
  in_done_.assign(in_.size(), 0);
  // Each slot holds one received reduce-scatter segment from its arrival
  // until the send that forwards it completed: depth receives plus depth
  // sends in flight, and one spare. Allocated on first use.
  const int slots = 2 * std::max(1, spec_.pipeline_depth) + 1;
  slots_.assign(slots, {});
  for (int i = slots - 1; i >= 0; --i) free_slots_.push_back(i);
}

void RingOp::build_schedule() {
  const int n = size_, r = rank_;
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  // Index of the first incoming message of each (phase, step).
  std::vector<int64_t> in_start_rs(n, 0), in_start_ag(n, 0);
  auto add_chunk = [&](std::vector<Msg>& list, bool reduce, int step, int chunk) {
    const int64_t count = spec_.chunk_counts[chunk];
    for (int64_t off = 0; off < count; off += segment_elems_)
      list.push_back(Msg{reduce, step, chunk, chunk_offset_[chunk] + off,
                         std::min(segment_elems_, count - off), -1, -1});
  };
  if (spec_.reduce_phase) {
    for (int s = 0; s < n - 1; ++s) {
      in_start_rs[s] = static_cast<int64_t>(in_.size());
      add_chunk(in_, true, s, mod(r - s - 2));
    }
  }
  if (spec_.gather_phase) {
    for (int s = 0; s < n - 1; ++s) {
      in_start_ag[s] = static_cast<int64_t>(in_.size());
      add_chunk(in_, false, s, mod(r - s - 1));
    }
  }
  if (spec_.reduce_phase) {
    for (int s = 0; s < n - 1; ++s) {
      const size_t first = out_.size();
      add_chunk(out_, true, s, mod(r - s - 1));
      if (s > 0)
        for (size_t k = first; k < out_.size(); ++k) out_[k].dep = in_start_rs[s - 1] + static_cast<int64_t>(k - first);
    }
  }
  if (spec_.gather_phase) {
    for (int s = 0; s < n - 1; ++s) {
      const size_t first = out_.size();
      add_chunk(out_, false, s, mod(r - s));
      for (size_t k = first; k < out_.size(); ++k) {
        const auto seg = static_cast<int64_t>(k - first);
        if (s > 0) out_[k].dep = in_start_ag[s - 1] + seg;
        else if (spec_.reduce_phase) out_[k].dep = in_start_rs[n - 2] + seg;
      }
    }
  }
}

TensorView RingOp::view(const TensorView& base, int64_t offset, int64_t count) const {
  return TensorView(static_cast<char*>(base.data) + offset * static_cast<int64_t>(dtype_size(spec_.dtype)),
                    count, spec_.dtype, base.device);
}

TensorView RingOp::scratch_view(int slot, int64_t count) const {
  return TensorView(const_cast<unsigned char*>(slots_[slot].data()), count, spec_.dtype);
}

int RingOp::take_slot() {
  if (free_slots_.empty()) return -1;
  const int s = free_slots_.back();
  free_slots_.pop_back();
  if (slots_[s].size() < wire_bytes_) slots_[s].resize(wire_bytes_);
  return s;
}

void RingOp::run(Transport& t) {
  const int64_t depth = t.throttled(*this) ? 1 : std::max(1, spec_.pipeline_depth);
  if (!edge_live(left_) || !edge_live(right_)) return;
  // Receives, in schedule order.
  while (next_in_ < static_cast<int64_t>(in_.size()) && next_in_ - processed_in_ < depth) {
    Msg& m = in_[next_in_];
    void* target;
    if (m.reduce) {
      const int s = take_slot();
      if (s < 0) break;
      m.slot = s;
      target = slots_[s].data();
    } else {
      target = view(spec_.gathered, m.offset, m.count).data;
    }
    recv_data(t, left_, next_in_, target, codec_->wire_bytes(m.count, spec_.dtype));
    ++next_in_;
  }
  // Sends, in schedule order, each once the segment it forwards arrived.
  while (next_out_ < static_cast<int64_t>(out_.size()) && next_out_ - completed_out_ < depth) {
    const Msg& m = out_[next_out_];
    if (m.dep >= 0 && !in_done_[m.dep]) break;
    const void* wire;
    if (m.reduce) {
      wire = m.dep < 0 ? codec_->encode(view(spec_.local, m.offset, m.count), nullptr, ctx_)
                       : codec_->encode(scratch_view(in_[m.dep].slot, m.count), nullptr, ctx_);
    } else {
      wire = codec_->encode(view(spec_.gathered, m.offset, m.count), nullptr, ctx_);
    }
    send_data(t, right_, next_out_, wire, codec_->wire_bytes(m.count, spec_.dtype));
    ++next_out_;
  }
}

void RingOp::on_received(Transport& t, int, int64_t index) {
  Msg& m = in_[index];
  if (m.reduce) {
    const TensorView local = view(spec_.local, m.offset, m.count);
    if (m.step == size_ - 2) {  // chunk r is complete: combine straight into the result
      const TensorView dst = view(spec_.result, m.offset - chunk_offset_[rank_], m.count);
      codec_->combine(slots_[m.slot].data(), local, spec_.op, dst, ctx_);
      if (spec_.op == ReduceOp::avg) kernels::finish_average(dst, size_, ctx_);
      free_slots_.push_back(m.slot);
      m.slot = -1;
    } else {
      codec_->combine(slots_[m.slot].data(), local, spec_.op, scratch_view(m.slot, m.count), ctx_);
    }
  } else {
    const TensorView dst = view(spec_.gathered, m.offset, m.count);
    codec_->decode(dst.data, dst, ctx_);
  }
  in_done_[index] = 1;
  ++processed_in_;
  run(t);
}

void RingOp::on_sent(Transport& t, int, int64_t index) {
  const Msg& m = out_[index];
  if (m.reduce && m.dep >= 0) {
    free_slots_.push_back(in_[m.dep].slot);
    in_[m.dep].slot = -1;
  }
  ++completed_out_;
  run(t);
}

bool RingOp::data_done() const {
  return processed_in_ == static_cast<int64_t>(in_.size()) &&
         completed_out_ == static_cast<int64_t>(out_.size());
}

}  // namespace relaxcc::mpi
