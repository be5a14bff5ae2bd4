// The pipelined ring over the transport: reduce-scatter and allgather over r -> r+1,
// written once and parameterised by a ChunkCodec. Allreduce runs both phases.
//
// The schedule (which segments go when, and what each waits for) is
// RingSchedule (src/collectives/ring_schedule.h); RingOp runs it in one of
// two modes, wire or shared, with a ChunkCodec deciding what a segment
// carries. Wire mode: each segment moves as soon as the segment it depends
// on arrived, with up to pipeline_depth segments in flight per direction
// (one while a higher-priority operation is active). Reduce-scatter
// segments land in scratch slots; allgather receives straight into the
// output. Segments of RELAXCC_OFFLOAD_BYTES or more (when set) are
// combined on the engine's compute thread.
//
// Shared mode (allreduce, reduce-scatter, or allgather, with every rank's full
// layout in node-shared memory, see src/collectives/shared_memory.h): edges carry empty
// tokens instead of data. A token says "segment k of the schedule is ready in
// my buffer"; the receiver reads it from the sender's buffer in place and
// combines it into its own (an allreduce's partial sums live in its shared
// output, where an allreduce out of place first copies the one chunk of its
// input that the right neighbour reads before any partial sum; a
// reduce-scatter's, which must leave its input as it was, in node-shared
// scratch that the header names), or copies it in allgather. One pass over the
// data less than through MPI. The schedule and its dependencies are the same; a
// rank's buffer is only read by its right neighbour, which reads a region only
// after the token for it and before the region's final value can come round the
// ring, and which sends a last "done reading" token back, so a rank's operation
// completes only when nobody reads its buffer any more.
//
// Receives are limited to pipeline_depth in flight (they bound the data in
// flight: MPI moves a large message once its receive is posted). Sends are
// posted as soon as their data is ready: posting costs no memory, and on
// shared memory a send completes only when the receiver pulled it and this
// rank next polls, so a send window would stall the pipeline. An operation
// throttled by a higher-priority one posts one segment at a time.
#pragma once

#include <memory>
#include <vector>

#include "src/collectives/chunk_codec.h"
#include "src/collectives/ring_schedule.h"
#include "src/collectives/shared_memory.h"
#include "src/engine/edge_op.h"

namespace relaxcc::engine {

struct RingSpec {
  OpType type = OpType::allreduce;  // allreduce, reduce_scatter or allgather
  bool reduce_phase = true;
  bool gather_phase = true;
  ReduceOp op = ReduceOp::sum;
  DType dtype = DType::f32;
  // Elements of chunk c; chunk offsets follow in rank order.
  std::vector<int64_t> chunk_counts;
  // Reduce-scatter contributions, in the full chunk layout (read only).
  TensorView local;
  // Where rank r's reduced chunk goes (reduce_phase), chunk r's elements only.
  TensorView result;
  // The full chunk layout that allgather fills (gather_phase).
  TensorView gathered;
  int64_t segment_bytes = 1 << 20;
  // Receives (and broadcast sends) in flight: the communicator's window.
  int pipeline_depth = 4;
  // Segments of at least this many bytes are combined on the engine's
  // compute thread (RequestPoster::compute); 0: all on the engine thread.
  int64_t offload_bytes = 0;
  int algo_id = 1;
  // Shared mode: where this rank's buffer lies (pid 0: not shared), and the
  // communicator's shared memory that maps the left neighbour's buffer.
  SharedRef shared;
  std::shared_ptr<SharedMemory> shared_memory;
  // Shared reduce-scatter on 3 or more ranks: node-shared scratch (from
  // shared_memory) in the full layout for this rank's partial sums, so its
  // input stays as it was.
  TensorView partials;
};

class RingOp final : public EdgeOp {
 public:
  RingOp(std::string name, int priority, std::string label, RingSpec spec, int rank, int size,
         const ExecContext& ctx, std::unique_ptr<ChunkCodec> codec);

 private:
  using RingSegment = relaxcc::RingSegment;

  void run(RequestPoster& t) override;
  void on_sent(RequestPoster& t, int pi, int64_t msg) override;
  void on_received(RequestPoster& t, int pi, int64_t msg) override;
  void on_computed(RequestPoster& t, int64_t msg, std::exception_ptr error) override;
  // Combines or decodes incoming message `index` where the schedule puts
  // it. Touches no transport state: it may run on the compute thread.
  void absorb(int64_t index);
  // Incoming message `index` is absorbed: what depends on it may go.
  void absorbed(int64_t index);
  bool data_done() const override;

  unsigned char* wire_slot(const RingSegment& m);
  void run_shared(RequestPoster& t, int64_t depth, int64_t send_window);
  // Where an incoming message's data lies: the received wire buffer, or the
  // left neighbour's buffer in shared mode.
  const unsigned char* incoming(const RingSegment& m);

  RingSpec spec_;
  int rank_, size_;
  ExecContext ctx_;
  std::unique_ptr<ChunkCodec> codec_;
  RingSchedule sched_;
  int left_ = 0, right_ = 0;  // peer indices
  size_t wire_bytes_ = 0;
  std::vector<char> in_done_, out_done_;
  int64_t next_in_ = 0, processed_in_ = 0, next_out_ = 0, completed_out_ = 0;
  ScratchPool::Buffer rs_buffer_;  // last-step slots, then the double buffer
  // Shared mode.
  bool shared_ = false;
  std::shared_ptr<const PeerMapping> left_buffer_, left_partials_;
  int64_t done_in_ = 0, done_out_ = 0;  // message index of the "done reading" tokens
  bool done_in_posted_ = false, done_out_posted_ = false, done_received_ = false,
       done_sent_ = false;
  char token_out_ = 0, token_in_ = 0;
};

}  // namespace relaxcc::engine
