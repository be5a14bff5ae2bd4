// A batch of sends and receives completed as one Work. Each send posts a
// small header (dtype, count) and then the data. Each receive takes the
// header first and only then posts the data receive: into the caller's
// tensor when dtype and count match, otherwise into scratch of the sender's
// size (then PeerMismatch), so the tensor is never written past its end and
// no message is left unmatched. Tags: header 2*tag, data 2*tag+1 on the
// point-to-point communicator. Data sends go out in batch order, one at a
// time while a higher-priority operation is active (Transport::throttled).
#pragma once

#include <vector>

#include "../mpi/engine.h"
#include "relaxcc/collectives/point_to_point.h"

namespace relaxcc::mpi {

class P2PBatchOp final : public Operation {
 public:
  P2PBatchOp(std::vector<P2POp> ops, int priority, std::string label);

  void start(Transport& t) override;
  void progress(Transport& t) override;
  void on_complete(Transport& t, int64_t slot, const MPI_Status& status, int error) override;
  void abort(Transport& t, std::exception_ptr error) override;
  bool collective() const override { return false; }
  bool done() const override {
    return started_ && ((outstanding_ == 0 && next_data_send_ == ops_.size()) || aborted_);
  }
  std::string waiting_for() const override;

 private:
  struct Wire {
    uint32_t magic;
    uint8_t dtype;
    uint8_t pad[3];
    int64_t count;
  };
  // Posts data sends from next_data_send_ on (one in flight when throttled).
  void post_data_sends(Transport& t);

  std::vector<P2POp> ops_;
  std::vector<Wire> headers_;
  std::string label_;
  bool started_ = false;
  int outstanding_ = 0;
  size_t next_data_send_ = 0;  // ops_ before it: data sent or not a send
  int data_sends_in_flight_ = 0;
  bool aborted_ = false;
  std::vector<ScratchPool::Buffer> drain_;
  std::vector<int> pending_;  // per op: its requests not completed yet
};

}  // namespace relaxcc::mpi
