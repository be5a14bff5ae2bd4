// Recursive-doubling allreduce for small messages, on the butterfly schedule
// (butterfly.h): each step sends this rank's whole data to one partner and
// combines the partner's. Operands are always combined lower rank first, so
// every rank computes bitwise identical results.
//
// An EdgeOp: headers, optimistic sends (the first step's data travels with
// the header, so a step costs one latency), mismatch detection, aborts and
// drains are the edge protocol's (edge_op.h). A step's send reads the
// caller's buffer, so the step combines only after its send completed. Data
// of up to kMaxSplitBytes moves in parts of kInlineBytes, each an eager
// message over shared memory (the first inside the header), where one
// message would go by rendezvous.
#pragma once

#include <algorithm>
#include <array>
#include <vector>

#include "src/collectives/butterfly.h"
#include "src/engine/edge_op.h"

namespace relaxcc::engine {

class RecursiveDoublingOp final : public EdgeOp {
 public:
  // The largest data moved in parts rather than as one message.
  static constexpr size_t kMaxSplitBytes = 9 * kInlineBytes;

  // `type`: what the header says the call is (a barrier runs as an allreduce
  // of one byte).
  RecursiveDoublingOp(std::string name, int priority, std::string label, const TensorView& data,
                      ReduceOp op, int rank, int size, const ExecContext& ctx, int algo_id,
                      OpType type = OpType::allreduce);

  // Whether the operation can run an allreduce of `data` again with
  // reuse(): it moves in as many messages per step (the edges depend on
  // nothing else).
  bool reusable_for(const TensorView& data) const {
    const Split s = split(data.nbytes());
    return type_ == OpType::allreduce && s.parts == parts_ &&
           (s.part_bytes <= kInlineBytes) == inline_first_;
  }
  // Another allreduce, once the engine dropped this one (reusable_for(data)).
  void reuse(int priority, const std::string& label, const TensorView& data, ReduceOp op,
             const ExecContext& ctx);

 private:
  struct Step {
    ButterflyMove move;
    int peer_index;
  };

  // How a step moves `bytes`: in `parts` messages of `part_bytes` (the last
  // may be shorter).
  struct Split {
    int parts = 1;
    size_t part_bytes = 0;
  };
  static Split split(size_t bytes) {
    if (bytes > kInlineBytes && bytes <= kMaxSplitBytes)
      return {static_cast<int>((bytes + kInlineBytes - 1) / kInlineBytes), kInlineBytes};
    return {1, bytes};
  }

  // Two ranks whose first part rides in the header message.
  bool begin_direct(RequestPoster& t, DirectExchange& x) override;
  DirectStep continue_direct(RequestPoster& t, DirectExchange& x) override;
  void leave_direct(RequestPoster& t) override;
  void run(RequestPoster& t) override;
  void on_sent(RequestPoster& t, int pi, int64_t msg) override;
  void on_received(RequestPoster& t, int pi, int64_t msg) override;
  bool data_done() const override { return step_ == num_steps_; }
  // Bytes of part `p` of a step's data.
  size_t part_offset(int p) const { return static_cast<size_t>(p) * part_bytes_; }
  size_t part_size(int p) const {
    return std::min(part_bytes_, data_.nbytes() - std::min(data_.nbytes(), part_offset(p)));
  }
  OpHeader make_header() const;
  // Combines the step's received data and moves to the next step.
  void finish_step();
  // Combines `theirs` (the partner's elements [first, first + theirs.numel)
  // of step `m`) into data_, lower rank first.
  void combine(const ButterflyMove& m, const TensorView& theirs, int64_t first = 0);

  TensorView data_;
  OpType type_;
  int algo_id_;
  ReduceOp op_;
  int rank_, size_;
  ExecContext ctx_;
  std::array<Step, ButterflySchedule::kMaxMoves> steps_;  // held inline: no allocation
  size_t num_steps_ = 0;
  size_t step_ = 0;
  int parts_ = 1;              // messages per step
  bool inline_first_ = false;  // a step's first message rides in the header message
  size_t part_bytes_ = 0;      // bytes per message (the last may be shorter)
  bool send_posted_ = false, recv_posted_ = false;
  int sends_done_ = 0, recvs_done_ = 0;
  ScratchPool::Buffer theirs_;
};

}  // namespace relaxcc::engine
