#include "ring.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "relaxcc/kernels/reduce.h"

namespace relaxcc::mpi {

namespace {
uint64_t layout_hash(const std::vector<int64_t>& counts, int64_t segment_elems) {
  Fnv1a h;
  for (int64_t c : counts) h.u64(static_cast<uint64_t>(c));
  return h.u64(static_cast<uint64_t>(segment_elems)).value();
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
  RELAXCC_ENFORCE_EQ(static_cast<int>(spec_.chunk_counts.size()), size_, InternalError,
                     "ring chunks");
  // The ring keeps partial sums in the received wire buffer. Codecs that
  // decode into a separate accumulator need an accumulator buffer as well.
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
  shared_ = spec_.shared.pid != 0;
  if (shared_) {
    const bool allreduce = spec_.type == OpType::allreduce;
    const bool allgather = spec_.type == OpType::allgather && !spec_.reduce_phase;
    const bool reduce_scatter =
        spec_.type == OpType::reduce_scatter && !spec_.gather_phase &&
        (size_ == 2 ||
         spec_.partials.nbytes() >= static_cast<size_t>(total) * dtype_size(spec_.dtype));
    RELAXCC_ENFORCE((allreduce || allgather || reduce_scatter) && spec_.shared_memory != nullptr,
                    InternalError,
                    "shared ring: only allreduce, reduce-scatter with scratch, allgather");
    h.shm_pid = spec_.shared.pid;
    h.shm_segment = spec_.shared.segment;
    h.shm_offset = spec_.shared.offset;
    if (reduce_scatter && size_ > 2)
      h.shm_scratch =
          spec_.shared_memory->find(spec_.partials.data, spec_.partials.nbytes())->segment;
    // An allreduce out of place: the right neighbour's first reduce-scatter
    // step reads this rank's contribution to chunk r-1 from the shared output
    // (later steps read partial sums, which go there), so it is copied there
    // before the operation starts.
    if (allreduce && spec_.local.data != spec_.gathered.data) {
      const int c = (rank_ - 1 + size_) % size_;
      const TensorView from = spec_.local.slice(chunk_offset_[c], spec_.chunk_counts[c]);
      if (from.numel > 0)
        std::memcpy(spec_.gathered.slice(chunk_offset_[c], from.numel).data, from.data,
                    from.nbytes());
    }
  }
  set_header(h);

  const int left_rank = (rank_ - 1 + size_) % size_, right_rank = (rank_ + 1) % size_;
  const int64_t n_in = static_cast<int64_t>(in_.size()), n_out = static_cast<int64_t>(out_.size());
  if (shared_) {
    // Tokens, plus one "done reading" token from right to left.
    if (left_rank == right_rank) {
      left_ = right_ = add_peer(left_rank, n_in + 1, n_out + 1);
      done_in_ = n_in;
      done_out_ = n_out;
    } else {
      left_ = add_peer(left_rank, n_in, 1);
      right_ = add_peer(right_rank, 1, n_out);
    }
  } else if (left_rank == right_rank) {
    left_ = right_ = add_peer(left_rank, n_in, n_out);
  } else {
    left_ = add_peer(left_rank, n_in, 0);
    right_ = add_peer(right_rank, 0, n_out);
  }
  in_done_.assign(in_.size(), 0);
  out_done_.assign(out_.size(), 0);
}

void RingOp::build_schedule() {
  const int n = size_, r = rank_;
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  // Index of the first incoming message of each (phase, step).
  std::vector<int64_t> in_start_rs(n, 0), in_start_ag(n, 0), out_start_rs(n, 0);
  auto add_chunk = [&](std::vector<Msg>& list, bool reduce, int step, int chunk) {
    const int64_t count = spec_.chunk_counts[chunk];
    for (int64_t off = 0, seg = 0; off < count; off += segment_elems_, ++seg)
      list.push_back(Msg{reduce, step, chunk, chunk_offset_[chunk] + off,
                         std::min(segment_elems_, count - off), seg, -1, -1});
    max_segments_ = std::max(max_segments_, (count + segment_elems_ - 1) / segment_elems_);
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
      out_start_rs[s] = static_cast<int64_t>(first);
      add_chunk(out_, true, s, mod(r - s - 1));
      if (s > 0)
        for (size_t k = first; k < out_.size(); ++k)
          out_[k].dep = in_start_rs[s - 1] + static_cast<int64_t>(k - first);
    }
    // Segment j of step s reuses the buffer half of step s-2, forwarded by
    // the send of step s-1.
    // (Segment j of step s-2 exists only if its chunk has that many segments.)
    std::vector<int64_t> in_segments(n, 0);
    for (const Msg& m : in_)
      if (m.reduce) ++in_segments[m.step];
    last_slots_ = std::min<int64_t>(std::max(1, spec_.pipeline_depth), in_segments[n - 2]);
    for (int64_t k = 0; k < static_cast<int64_t>(in_.size()); ++k) {
      Msg& m = in_[k];
      if (!m.reduce) continue;
      if (m.step == n - 2) {
        if (m.seg >= last_slots_) m.reuse_in = k - last_slots_;
      } else if (m.step >= 2 && m.seg < in_segments[m.step - 2]) {
        m.reuse = out_start_rs[m.step - 1] + m.seg;
      }
    }
  }
  if (spec_.gather_phase) {
    for (int s = 0; s < n - 1; ++s) {
      const size_t first = out_.size();
      add_chunk(out_, false, s, mod(r - s));
      for (size_t k = first; k < out_.size(); ++k) {
        const auto seg = static_cast<int64_t>(k - first);
        if (s > 0)
          out_[k].dep = in_start_ag[s - 1] + seg;
        else if (spec_.reduce_phase)
          out_[k].dep = in_start_rs[n - 2] + seg;
      }
    }
  }
}

unsigned char* RingOp::wire_slot(const Msg& m) {
  const int64_t slot = m.step == size_ - 2 ? m.seg % last_slots_
                                           : last_slots_ + (m.step % 2) * max_segments_ + m.seg;
  return rs_buffer_.data() + slot * static_cast<int64_t>(wire_bytes_);
}

const unsigned char* RingOp::incoming(const Msg& m) {
  if (!shared_)
    return m.reduce
               ? wire_slot(m)
               : static_cast<const unsigned char*>(spec_.gathered.slice(m.offset, m.count).data);
  const uint64_t at = static_cast<uint64_t>(m.offset) * dtype_size(spec_.dtype);
  // A reduce-scatter's partial sums (steps after the first) are in scratch.
  if (m.reduce && m.step > 0 && left_partials_) return left_partials_->base + at;
  return left_buffer_->base + peer_header(left_).shm_offset + at;
}

void RingOp::run_shared(Transport& t, int64_t depth, int64_t send_window) {
  // Release this rank's writes before the tokens that announce them.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const auto n_out = static_cast<int64_t>(out_.size()), n_in = static_cast<int64_t>(in_.size());
  while (next_out_ < n_out && next_out_ - completed_out_ < send_window) {
    const Msg& m = out_[next_out_];
    if (m.dep >= 0 && !in_done_[m.dep]) break;
    send_data(t, right_, next_out_++, &token_out_, 0);
  }
  if (edge_live(left_)) {
    if (!left_buffer_) {
      const OpHeader& lh = peer_header(left_);
      const int64_t total = chunk_offset_.back() + spec_.chunk_counts.back();
      const size_t bytes = static_cast<size_t>(total) * dtype_size(spec_.dtype);
      const int left_rank = (rank_ - 1 + size_) % size_;
      left_buffer_ = spec_.shared_memory->map_peer(
          SharedRef{lh.shm_pid, lh.shm_segment, lh.shm_offset}, bytes, left_rank);
      if (lh.shm_scratch != 0)
        left_partials_ = spec_.shared_memory->map_peer(SharedRef{lh.shm_pid, lh.shm_scratch, 0},
                                                       bytes, left_rank);
    }
    while (next_in_ < n_in && next_in_ - processed_in_ < depth)
      recv_data(t, left_, next_in_++, &token_in_, 0);
    // Every read of the left neighbour's buffer is done.
    if (processed_in_ == n_in && next_out_ == n_out && !done_out_posted_) {
      done_out_posted_ = true;
      send_data(t, left_, done_out_, &token_out_, 0);
    }
  }
  if (next_in_ == n_in && !done_in_posted_ && edge_live(right_)) {
    done_in_posted_ = true;
    recv_data(t, right_, done_in_, &token_in_, 0);
  }
}

void RingOp::run(Transport& t) {
  const bool throttled = t.throttled(*this);
  const int64_t depth = throttled ? 1 : std::max(1, spec_.pipeline_depth);
  const int64_t send_window = throttled ? 1 : static_cast<int64_t>(out_.size());
  if (shared_) {
    run_shared(t, depth, send_window);
    return;
  }
  // Sends first, optimistically (before the right neighbour's header
  // arrived): posting one only announces it, while posting a receive for a
  // message that already arrived copies it on the spot (shared-memory
  // single copy), which would hold back this rank's own sends. Both in
  // schedule order; a send waits for the segment it forwards. Segments
  // larger than an inline message wait for the right neighbour's header:
  // over TCP an early rendezvous send, once cleared, is written out whole
  // inside one MPI call, and the peer's header behind it is read late.
  while (next_out_ < static_cast<int64_t>(out_.size()) &&
         next_out_ - completed_out_ < send_window) {
    const Msg& m = out_[next_out_];
    if (m.dep >= 0 && !in_done_[m.dep]) break;
    const size_t bytes = codec_->wire_bytes(m.count, spec_.dtype);
    if (!edge_live(right_) && bytes > kInlineBytes) break;
    const void* wire;
    if (m.reduce) {
      wire = m.dep < 0 ? codec_->encode(spec_.local.slice(m.offset, m.count), nullptr, ctx_)
                       : codec_->encode(TensorView(wire_slot(in_[m.dep]), m.count, spec_.dtype),
                                        nullptr, ctx_);
    } else {
      wire = codec_->encode(spec_.gathered.slice(m.offset, m.count), nullptr, ctx_);
    }
    send_data(t, right_, next_out_, wire, bytes);
    ++next_out_;
  }
  // Receives, in schedule order, once the left neighbour's header matched.
  if (!edge_live(left_)) return;
  while (next_in_ < static_cast<int64_t>(in_.size()) && next_in_ - processed_in_ < depth) {
    Msg& m = in_[next_in_];
    void* target;
    if (m.reduce) {
      if (m.reuse >= 0 && !out_done_[m.reuse]) break;
      if (m.reuse_in >= 0 && !in_done_[m.reuse_in]) break;
      if (rs_buffer_.size() == 0) {
        const int64_t halves = std::min(2, size_ - 2);  // steps before the last
        rs_buffer_ =
            t.scratch(static_cast<size_t>(last_slots_ + halves * max_segments_) * wire_bytes_);
      }
      target = wire_slot(m);
    } else {
      target = spec_.gathered.slice(m.offset, m.count).data;
    }
    recv_data(t, left_, next_in_, target, codec_->wire_bytes(m.count, spec_.dtype));
    ++next_in_;
  }
}

void RingOp::on_received(Transport& t, int pi, int64_t index) {
  if (shared_ && pi == right_ && index == done_in_) {
    done_received_ = true;
    return;
  }
  if (shared_) std::atomic_thread_fence(std::memory_order_seq_cst);  // acquire the sender's writes
  const Msg& m = in_[index];
  // (An allgather segment received straight into the output needs no work.)
  if (spec_.offload_bytes > 0 && (m.reduce || shared_) &&
      m.count * static_cast<int64_t>(dtype_size(spec_.dtype)) >= spec_.offload_bytes) {
    t.compute(*this, index, [this, index] { absorb(index); });
    return;
  }
  absorb(index);
  absorbed(index);
  run(t);
}

void RingOp::on_computed(Transport& t, int64_t index, std::exception_ptr error) {
  if (error) {
    abort(t, std::move(error));
    return;
  }
  absorbed(index);  // the engine runs the schedule on next
}

void RingOp::absorbed(int64_t index) {
  in_done_[index] = 1;
  ++processed_in_;
}

void RingOp::absorb(int64_t index) {
  const Msg& m = in_[index];
  const unsigned char* wire = incoming(m);
  if (m.reduce) {
    const TensorView local = spec_.local.slice(m.offset, m.count);
    if (m.step == size_ - 2) {  // chunk r is complete: combine straight into the result
      const TensorView dst = spec_.result.slice(m.offset - chunk_offset_[rank_], m.count);
      codec_->combine(wire, local, spec_.op, dst, ctx_);
      if (spec_.op == ReduceOp::avg) kernels::finish_average(dst, size_, ctx_);
    } else {
      // A partial sum: in the wire slot, in the shared output (an
      // allreduce's), or in a shared reduce-scatter's scratch.
      void* acc = const_cast<unsigned char*>(wire);
      if (shared_ && spec_.partials.data != nullptr)
        acc = spec_.partials.as<unsigned char>() +
              static_cast<uint64_t>(m.offset) * dtype_size(spec_.dtype);
      else if (shared_)
        acc = spec_.gathered.slice(m.offset, m.count).data;
      codec_->combine(wire, local, spec_.op, TensorView(acc, m.count, spec_.dtype), ctx_);
    }
  } else {
    codec_->decode(wire, spec_.gathered.slice(m.offset, m.count), ctx_);
  }
}

void RingOp::on_sent(Transport& t, int pi, int64_t index) {
  if (shared_ && pi == left_ && index == done_out_) {
    done_sent_ = true;
    return;
  }
  out_done_[index] = 1;
  ++completed_out_;
  run(t);
}

bool RingOp::data_done() const {
  if (shared_ && !(done_received_ && done_sent_)) return false;
  return processed_in_ == static_cast<int64_t>(in_.size()) &&
         completed_out_ == static_cast<int64_t>(out_.size());
}

}  // namespace relaxcc::mpi
