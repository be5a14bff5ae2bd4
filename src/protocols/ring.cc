#include "src/protocols/ring.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "relaxcc/kernels/reduce.h"

namespace relaxcc::engine {

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
      codec_(std::move(codec)),
      sched_(rank, size, spec_.chunk_counts,
             spec_.segment_bytes / static_cast<int64_t>(dtype_size(spec_.dtype)),
             spec_.pipeline_depth, spec_.reduce_phase, spec_.gather_phase) {
  RELAXCC_ENFORCE(size_ >= 2, InternalError, "ring needs 2 or more ranks");
  RELAXCC_ENFORCE_EQ(static_cast<int>(spec_.chunk_counts.size()), size_, InternalError,
                     "ring chunks");
  // The ring keeps partial sums in the received wire buffer. Codecs that
  // decode into a separate accumulator need an accumulator buffer as well.
  RELAXCC_ENFORCE(codec_->in_place(), Unsupported, "ring with codec '", codec_->name(),
                  "': only in-place codecs are supported by this ring");
  wire_bytes_ = codec_->wire_bytes(sched_.segment_elems, spec_.dtype);
  const int64_t total = sched_.chunk_offset.back() + spec_.chunk_counts.back();

  OpHeader h;
  h.type = spec_.type;
  h.dtype = spec_.dtype;
  h.op = spec_.reduce_phase ? spec_.op : ReduceOp::sum;
  h.algo = static_cast<uint8_t>(spec_.algo_id);
  h.count = total;
  h.layout = layout_hash(spec_.chunk_counts, sched_.segment_elems);
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
      const TensorView from = spec_.local.slice(sched_.chunk_offset[c], spec_.chunk_counts[c]);
      if (from.numel > 0)
        std::memcpy(spec_.gathered.slice(sched_.chunk_offset[c], from.numel).data, from.data,
                    from.nbytes());
    }
  }
  set_header(h);

  const int left_rank = (rank_ - 1 + size_) % size_, right_rank = (rank_ + 1) % size_;
  const int64_t n_in = static_cast<int64_t>(sched_.in.size()),
                n_out = static_cast<int64_t>(sched_.out.size());
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
  in_done_.assign(sched_.in.size(), 0);
  out_done_.assign(sched_.out.size(), 0);
}

unsigned char* RingOp::wire_slot(const RingSegment& m) {
  return rs_buffer_.data() + sched_.slot(m, size_) * static_cast<int64_t>(wire_bytes_);
}

const unsigned char* RingOp::incoming(const RingSegment& m) {
  if (!shared_)
    return m.reduce
               ? wire_slot(m)
               : static_cast<const unsigned char*>(spec_.gathered.slice(m.offset, m.count).data);
  const uint64_t at = static_cast<uint64_t>(m.offset) * dtype_size(spec_.dtype);
  // A reduce-scatter's partial sums (steps after the first) are in scratch.
  if (m.reduce && m.step > 0 && left_partials_) return left_partials_->base + at;
  return left_buffer_->base + peer_header(left_).shm_offset + at;
}

void RingOp::run_shared(RequestPoster& t, int64_t depth, int64_t send_window) {
  // Release this rank's writes before the tokens that announce them.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const auto n_out = static_cast<int64_t>(sched_.out.size()),
             n_in = static_cast<int64_t>(sched_.in.size());
  while (next_out_ < n_out && next_out_ - completed_out_ < send_window) {
    const RingSegment& m = sched_.out[next_out_];
    if (m.dep >= 0 && !in_done_[m.dep]) break;
    send_data(t, right_, next_out_++, &token_out_, 0);
  }
  if (edge_live(left_)) {
    if (!left_buffer_) {
      const OpHeader& lh = peer_header(left_);
      const int64_t total = sched_.chunk_offset.back() + spec_.chunk_counts.back();
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

void RingOp::run(RequestPoster& t) {
  const bool throttled = t.throttled(*this);
  const int64_t depth = throttled ? 1 : std::max(1, spec_.pipeline_depth);
  const int64_t send_window = throttled ? 1 : static_cast<int64_t>(sched_.out.size());
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
  while (next_out_ < static_cast<int64_t>(sched_.out.size()) &&
         next_out_ - completed_out_ < send_window) {
    const RingSegment& m = sched_.out[next_out_];
    if (m.dep >= 0 && !in_done_[m.dep]) break;
    const size_t bytes = codec_->wire_bytes(m.count, spec_.dtype);
    if (!edge_live(right_) && bytes > kInlineBytes) break;
    const void* wire;
    if (m.reduce) {
      wire = m.dep < 0
                 ? codec_->encode(spec_.local.slice(m.offset, m.count), nullptr, ctx_)
                 : codec_->encode(TensorView(wire_slot(sched_.in[m.dep]), m.count, spec_.dtype),
                                  nullptr, ctx_);
    } else {
      wire = codec_->encode(spec_.gathered.slice(m.offset, m.count), nullptr, ctx_);
    }
    send_data(t, right_, next_out_, wire, bytes);
    ++next_out_;
  }
  // Receives, in schedule order, once the left neighbour's header matched.
  if (!edge_live(left_)) return;
  while (next_in_ < static_cast<int64_t>(sched_.in.size()) && next_in_ - processed_in_ < depth) {
    RingSegment& m = sched_.in[next_in_];
    void* target;
    if (m.reduce) {
      if (m.reuse >= 0 && !out_done_[m.reuse]) break;
      if (m.reuse_in >= 0 && !in_done_[m.reuse_in]) break;
      if (rs_buffer_.size() == 0)
        rs_buffer_ = t.scratch(static_cast<size_t>(sched_.slots(size_)) * wire_bytes_);
      target = wire_slot(m);
    } else {
      target = spec_.gathered.slice(m.offset, m.count).data;
    }
    recv_data(t, left_, next_in_, target, codec_->wire_bytes(m.count, spec_.dtype));
    ++next_in_;
  }
}

void RingOp::on_received(RequestPoster& t, int pi, int64_t index) {
  if (shared_ && pi == right_ && index == done_in_) {
    done_received_ = true;
    return;
  }
  if (shared_) std::atomic_thread_fence(std::memory_order_seq_cst);  // acquire the sender's writes
  const RingSegment& m = sched_.in[index];
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

void RingOp::on_computed(RequestPoster& t, int64_t index, std::exception_ptr error) {
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
  const RingSegment& m = sched_.in[index];
  const unsigned char* wire = incoming(m);
  if (m.reduce) {
    const TensorView local = spec_.local.slice(m.offset, m.count);
    if (m.step == size_ - 2) {  // chunk r is complete: combine straight into the result
      const TensorView dst = spec_.result.slice(m.offset - sched_.chunk_offset[rank_], m.count);
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

void RingOp::on_sent(RequestPoster& t, int pi, int64_t index) {
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
  return processed_in_ == static_cast<int64_t>(sched_.in.size()) &&
         completed_out_ == static_cast<int64_t>(sched_.out.size());
}

}  // namespace relaxcc::engine
