// MpiCollectiveOp: an agreement over MPI's own non-blocking collectives, for
// the communicator handshake (every other collective is an EdgeOp, which also
// runs on groups). Only on a lane that spans its MPI communicator.
//
// Stages, all in the operation's collective turn (Transport::collective_turn)
// so every rank starts MPI collectives in the same order:
//   1. MPI_Ialltoall of per-peer OpHeaders: every rank checks every peer's
//      header against its own (counts, dtypes, and per-edge counts);
//   2. MPI_Iallreduce(MAX) of the verdicts, so a disagreement anywhere raises
//      PeerMismatch on every rank (and a rank whose dependency failed,
//      start_failed, makes every rank fail with CommunicationError);
// Both complete only once every rank has entered, which makes the operation
// a timed barrier as well.
#pragma once

#include <vector>

#include "../mpi/engine.h"
#include "../mpi/op_header.h"

namespace relaxcc::mpi {

class MpiCollectiveOp final : public Operation {
 public:
  // `headers[p]` is what this rank tells rank p (per-edge fields set).
  MpiCollectiveOp(std::string name, int priority, std::string label, std::vector<OpHeader> headers);

  void start(Transport& t) override;
  void start_failed(Transport& t, std::exception_ptr error) override;
  bool uses_mpi_collectives() const override { return true; }
  void progress(Transport& t) override;
  void on_complete(Transport& t, int64_t slot, const MPI_Status& status, int error) override;
  void abort(Transport& t, std::exception_ptr error) override;
  bool done() const override { return done_; }
  std::string waiting_for() const override;

 private:
  enum Stage { kWaitTurn, kHeaders, kVerdict, kDone };
  // Verdicts, ordered: the largest over all ranks wins.
  enum Verdict : int { kAgree = 0, kMismatch = 1, kUpstreamFailed = 2 };
  void finish(Transport& t);

  std::string label_;
  std::vector<OpHeader> out_, in_;
  Stage stage_ = kWaitTurn;
  int local_verdict_ = 0, global_verdict_ = 0;
  std::string mismatch_;
  std::exception_ptr upstream_;  // start_failed's error
  bool done_ = false;
};

}  // namespace relaxcc::mpi
