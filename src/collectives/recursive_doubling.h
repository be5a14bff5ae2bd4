// Recursive-doubling allreduce for small messages.
//
// With p the largest power of two <= n and rem = n - p, the first 2*rem ranks
// fold in pairs (even rank r hands its data to r+1 and later gets the result
// back); the p remaining ranks run log2(p) rounds, exchanging the whole tensor
// with the rank whose index differs in bit k. Operands are always combined
// lower rank first, so every rank computes bitwise identical results.
//
// Every message carries the sender's OpHeader (and an AbortRecord), so no
// separate header exchange costs a round trip. Receives are sized from a
// matched probe (MPI_Improbe), so a peer that sends more than expected is
// reported, never written past the buffer. Each edge carries exactly one
// message per direction; a rank that failed still runs the schedule, sending
// abort headers instead of data, so no rank waits forever and no message is
// left unmatched.
#pragma once

#include <vector>

#include "../mpi/engine.h"
#include "../mpi/op_header.h"
#include "relaxcc/exec_context.h"

namespace relaxcc::mpi {

class RecursiveDoublingOp final : public Operation {
 public:
  RecursiveDoublingOp(std::string name, int priority, std::string label, const TensorView& data,
                      ReduceOp op, int rank, int size, const ExecContext& ctx, int algo_id);

  void start(Transport& t) override;
  void progress(Transport& t) override;  // probes for the step's message
  void on_complete(Transport& t, int64_t slot, const MPI_Status& status, int error) override;
  void abort(Transport& t, std::exception_ptr error) override;
  bool done() const override { return done_; }
  std::string waiting_for() const override;

 private:
  enum class StepKind { fold_in, round, fold_out_send, fold_out_recv, fold_in_send };
  struct Step {
    StepKind kind;
    int peer;
    bool send, recv;
  };
  struct Prefix {
    OpHeader header;
    AbortRecord abort;
    int32_t aborted = 0;
    int32_t pad = 0;
  };

  void post_step(Transport& t);
  void finish_step(Transport& t);
  void record_failure(std::exception_ptr error, const std::string& reason, AbortKind kind, int origin);
  size_t message_bytes() const { return sizeof(Prefix) + data_.nbytes(); }

  std::string label_;
  TensorView data_;
  ReduceOp op_;
  int rank_, size_;
  ExecContext ctx_;
  OpHeader header_;
  std::vector<Step> steps_;
  size_t step_ = 0;
  bool posted_ = false;
  bool probing_ = false;
  int outstanding_ = 0;
  size_t received_bytes_ = 0;
  bool recv_ok_ = false;
  bool done_ = false;
  bool failed_ = false;
  AbortRecord failure_;
  std::vector<unsigned char> send_buf_, recv_buf_;
};

}  // namespace relaxcc::mpi
