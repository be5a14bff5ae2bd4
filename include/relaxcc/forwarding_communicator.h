// A Communicator that forwards every call to another one (inner_): derive
// from it and override the calls to observe or change (test doubles that
// tamper with payloads, relaxcc-bench's traffic counter). A communicator
// made from it (group(), split(), split_node_local()) is the inner one's,
// not forwarded, unless those calls are overridden too. As with every
// Communicator, call it through the base class (a CommunicatorPtr): the
// base declares the default arguments. A virtual added to Communicator
// must be forwarded here too.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "relaxcc/communicator.h"

namespace relaxcc {

class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(CommunicatorPtr inner) : inner_(std::move(inner)) {}
  using Communicator::allreduce;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  bool poisoned() const override { return inner_->poisoned(); }
  void poison(const std::string& reason) override { inner_->poison(reason); }
  CommStats stats() const override { return inner_->stats(); }
  int max_p2p_tag() const override { return inner_->max_p2p_tag(); }
  std::shared_ptr<Communicator> group(const std::vector<int>& members,
                                      const GroupOptions& options) override {
    return inner_->group(members, options);
  }
  std::shared_ptr<Communicator> split(int color, int key, const SplitOptions& options) override {
    return inner_->split(color, key, options);
  }
  std::shared_ptr<Communicator> split_node_local(const SplitOptions& options) override {
    return inner_->split_node_local(options);
  }
  std::shared_ptr<Communicator> host_communicator() const override {
    return inner_->host_communicator();
  }
  TensorView allocate(int64_t numel, DType dtype) override {
    return inner_->allocate(numel, dtype);
  }
  TensorView host_scratch(int64_t bytes) override { return inner_->host_scratch(bytes); }
  WorkPtr point_to_point(const std::vector<P2POp>& ops, const ExecContext& ctx,
                         const P2POptions& options) override {
    return inner_->point_to_point(ops, ctx, options);
  }
  WorkPtr allreduce(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                    const AllreduceOptions& options) override {
    return inner_->allreduce(input, output, ctx, options);
  }
  WorkPtr reduce_scatter(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                         const ReduceScatterOptions& options) override {
    return inner_->reduce_scatter(input, output, ctx, options);
  }
  WorkPtr allgather(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                    const AllgatherOptions& options) override {
    return inner_->allgather(input, output, ctx, options);
  }
  WorkPtr allgatherv(const TensorView& input, const TensorView& output,
                     const std::vector<int64_t>& counts, const ExecContext& ctx,
                     const AllgatherOptions& options) override {
    return inner_->allgatherv(input, output, counts, ctx, options);
  }
  WorkPtr broadcast(const TensorView& data, const ExecContext& ctx,
                    const BroadcastOptions& options) override {
    return inner_->broadcast(data, ctx, options);
  }
  WorkPtr alltoall(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                   const AlltoallOptions& options) override {
    return inner_->alltoall(input, output, ctx, options);
  }
  WorkPtr alltoallv(const TensorView& input, const std::vector<int64_t>& send_counts,
                    const TensorView& output, const std::vector<int64_t>& recv_counts,
                    const ExecContext& ctx, const AlltoallOptions& options) override {
    return inner_->alltoallv(input, send_counts, output, recv_counts, ctx, options);
  }
  WorkPtr barrier(const BarrierOptions& options) override { return inner_->barrier(options); }
  WorkPtr compute(std::function<void()> fn, const OpOptions& options) override {
    return inner_->compute(std::move(fn), options);
  }

 protected:
  CommunicatorPtr inner_;
};

}  // namespace relaxcc
