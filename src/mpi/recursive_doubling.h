// Recursive-doubling allreduce for small messages, on the butterfly schedule
// (butterfly.h): each step sends this rank's whole data to one partner and
// combines the partner's. Operands are always combined lower rank first, so
// every rank computes bitwise identical results.
//
// An EdgeOp: headers, optimistic sends (the first step's data travels with
// the header, so a step costs one latency), mismatch detection, aborts and
// drains are the edge protocol's (edge_op.h). A step's send reads the
// caller's buffer, so the step combines only after its send completed.
#pragma once

#include <array>
#include <vector>

#include "../collectives/butterfly.h"
#include "edge_op.h"

namespace relaxcc::mpi {

class RecursiveDoublingOp final : public EdgeOp {
 public:
  // `type`: what the header says the call is (a barrier runs as an allreduce
  // of one byte).
  RecursiveDoublingOp(std::string name, int priority, std::string label, const TensorView& data,
                      ReduceOp op, int rank, int size, const ExecContext& ctx, int algo_id,
                      OpType type = OpType::allreduce);

 private:
  struct Step {
    ButterflyMove move;
    int peer_index;
  };

  void run(Transport& t) override;
  void on_sent(Transport& t, int pi, int64_t msg) override;
  void on_received(Transport& t, int pi, int64_t msg) override;
  bool data_done() const override { return step_ == num_steps_; }
  // Combines the step's received data and moves to the next step.
  void finish_step();

  TensorView data_;
  ReduceOp op_;
  int rank_, size_;
  ExecContext ctx_;
  std::array<Step, ButterflySchedule::kMaxMoves> steps_;  // held inline: no allocation
  size_t num_steps_ = 0;
  size_t step_ = 0;
  bool send_posted_ = false, recv_posted_ = false, send_done_ = false, recv_done_ = false;
  ScratchPool::Buffer theirs_;
};

}  // namespace relaxcc::mpi
