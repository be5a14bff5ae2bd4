// NcclCommunicator (include/relaxcc/nccl_communicator.h): NCCL calls on the
// communicator's own stream, each operation's Work completed by a CUDA event
// (NcclState and NcclWork: src/nccl/nccl_state.h).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "relaxcc/errors.h"
#include "relaxcc/logging.h"
#include "relaxcc/mpi_communicator.h"
#include "relaxcc/nccl_communicator.h"
#include "src/collectives/argument_checks.h"
#include "src/nccl/device_checks.h"
#include "src/nccl/nccl_state.h"
#include "src/nccl/nccl_types.h"
#include "src/nccl/watchdog.h"

namespace relaxcc::nccl {
namespace {

std::string shape(const TensorView& t) {
  return detail::concat(t.numel, " x ", dtype_name(t.dtype));
}

size_t count_of(const TensorView& t) {
  return static_cast<size_t>(t.numel);
}

void* byte_offset(void* data, int64_t elements, DType dtype) {
  return static_cast<unsigned char*>(data) + elements * static_cast<int64_t>(dtype_size(dtype));
}

CommunicatorPtr make_nccl_communicator(CommunicatorPtr host, int device,
                                       const NcclCommunicatorOptions& options,
                                       milliseconds timeout);

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclState> state, CommunicatorPtr host,
                   NcclCommunicatorOptions options, milliseconds timeout)
      : state_(std::move(state)),
        host_(std::move(host)),
        options_(std::move(options)),
        timeout_(timeout) {
    options_.bootstrap = nullptr;  // host_ holds it
  }
  ~NcclCommunicator() override { state_->shutdown(); }

  int rank() const override { return state_->rank(); }
  int size() const override { return state_->size(); }
  bool poisoned() const override { return state_->poisoned(); }
  // NCCL has no notices: the NCCL communicator is aborted here, and the
  // host communicator (the bootstrap) poisoned, notices included, so peers
  // learn it in their host-side exchanges; a peer inside an NCCL
  // collective of this communicator fails at its own timeout.
  void poison(const std::string& reason) override {
    if (!state_->poisoned()) state_->poison(reason, true);
    host_->poison(reason);
  }
  CommStats stats() const override { return state_->stats(); }
  // NCCL has no tags: any tag is accepted, and messages match in posting order.
  int max_p2p_tag() const override { return (1 << 30) - 1; }

  std::shared_ptr<Communicator> group(const std::vector<int>& members,
                                      const GroupOptions& options) override {
    state_->throw_if_poisoned("group");
    return derive(host_->group(members, options));
  }
  std::shared_ptr<Communicator> split(int color, int key, const SplitOptions& options) override {
    state_->throw_if_poisoned("split");
    return derive(host_->split(color, key, options));
  }
  std::shared_ptr<Communicator> split_node_local(const SplitOptions& options) override {
    state_->throw_if_poisoned("split_node_local");
    return derive(host_->split_node_local(options));
  }

  // The bootstrap: the host communicator over these ranks.
  std::shared_ptr<Communicator> host_communicator() const override { return host_; }

  TensorView allocate(int64_t numel, DType dtype) override {
    RELAXCC_ENFORCE(static_cast<int>(dtype) < kNumDTypes, InvalidArgument, state_->who(),
                    ": allocate: unknown dtype ", static_cast<int>(dtype));
    RELAXCC_ENFORCE(numel >= 0, InvalidArgument, state_->who(),
                    ": allocate: negative element count ", numel);
    const Device where = Device::cuda(state_->device());
    if (numel == 0) return TensorView(nullptr, 0, dtype, where);
    const size_t bytes = static_cast<size_t>(numel) * dtype_size(dtype);
    DeviceGuard guard(state_->device(), state_->who());
    std::shared_ptr<void> owner = state_->take_block(bytes);
    void* data = owner.get();
    return TensorView(data, numel, dtype, where, std::move(owner));
  }

  WorkPtr point_to_point(const std::vector<P2POp>& ops, const ExecContext& ctx,
                         const P2POptions& options) override {
    check_point_to_point(ops, options, size(), max_p2p_tag());
    RELAXCC_ENFORCE(options.round == 0 && !options.deadline, Unsupported, state_->who(),
                    ": point_to_point: rounds and deadlines (P2POptions::round, deadline) are "
                    "not supported by the NCCL communicator");
    std::vector<TensorView> keep;
    keep.reserve(ops.size());
    for (const P2POp& op : ops) {
      check(op.tensor, ctx,
            op.kind == P2POp::Kind::send ? "point_to_point send tensor"
                                         : "point_to_point receive tensor",
            options.label);
      keep.push_back(op.tensor);
    }
    return state_->enqueue(
        "point_to_point", "ncclGroupEnd", options, &ctx, std::move(keep),
        detail::concat(ops.size(), " ops"), [&](ncclComm_t comm, cudaStream_t stream) {
          group_calls(options.label, [&] {
            for (const P2POp& op : ops) {
              const ncclDataType_t t = nccl_dtype(op.tensor.dtype);
              if (op.kind == P2POp::Kind::send)
                state_->check_nccl(
                    ncclSend(op.tensor.data, count_of(op.tensor), t, op.peer, comm, stream),
                    "ncclSend", options.label);
              else
                state_->check_nccl(
                    ncclRecv(op.tensor.data, count_of(op.tensor), t, op.peer, comm, stream),
                    "ncclRecv", options.label);
            }
          });
          for (const P2POp& op : ops)
            state_->count_traffic(op.peer, op.kind == P2POp::Kind::send ? op.tensor.nbytes() : 0,
                                  op.kind == P2POp::Kind::recv ? op.tensor.nbytes() : 0);
        });
  }

  using Communicator::allreduce;
  WorkPtr allreduce(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                    const AllreduceOptions& options) override {
    check_allreduce(input, output, options);
    check(input, ctx, "allreduce input", options.label);
    check(output, ctx, "allreduce output", options.label);
    RELAXCC_ENFORCE(options.algo != AllreduceAlgo::recursive_doubling, Unsupported, state_->who(),
                    ": allreduce: recursive_doubling is not available on the NCCL communicator "
                    "(NCCL picks its own algorithm: pass auto)");
    RELAXCC_ENFORCE(options.shares.empty(), Unsupported, state_->who(),
                    ": allreduce: unequal shares are not available on the NCCL communicator "
                    "(NCCL picks its own chunks)");
    const ncclDataType_t t = nccl_dtype(output.dtype);
    const ncclRedOp_t op = nccl_op(options.op);
    return state_->enqueue(
        "allreduce", "ncclAllReduce", options, &ctx, {input, output}, shape(output),
        [&](ncclComm_t comm, cudaStream_t stream) {
          if (output.numel == 0) return;  // every rank has no elements: nothing to call
          state_->check_nccl(
              ncclAllReduce(input.data, output.data, count_of(output), t, op, comm, stream),
              "ncclAllReduce", options.label);
        });
  }

  WorkPtr reduce_scatter(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                         const ReduceScatterOptions& options) override {
    check_reduce_scatter(input, output, options, size());
    check(input, ctx, "reduce_scatter input", options.label);
    check(output, ctx, "reduce_scatter output", options.label);
    const ncclDataType_t t = nccl_dtype(output.dtype);
    const ncclRedOp_t op = nccl_op(options.op);
    return state_->enqueue(
        "reduce_scatter", "ncclReduceScatter", options, &ctx, {input, output}, shape(output),
        [&](ncclComm_t comm, cudaStream_t stream) {
          if (output.numel == 0) return;
          state_->check_nccl(
              ncclReduceScatter(input.data, output.data, count_of(output), t, op, comm, stream),
              "ncclReduceScatter", options.label);
        });
  }

  WorkPtr allgather(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                    const AllgatherOptions& options) override {
    const int n = size();
    check_allgatherv(input, output, std::vector<int64_t>(static_cast<size_t>(n), input.numel),
                     rank(), n);
    check(input, ctx, "allgather input", options.label);
    check(output, ctx, "allgather output", options.label);
    const ncclDataType_t t = nccl_dtype(input.dtype);
    return state_->enqueue("allgather", "ncclAllGather", options, &ctx, {input, output},
                           shape(input), [&](ncclComm_t comm, cudaStream_t stream) {
                             if (input.numel == 0) return;
                             state_->check_nccl(ncclAllGather(input.data, output.data,
                                                              count_of(input), t, comm, stream),
                                                "ncclAllGather", options.label);
                           });
  }

  WorkPtr allgatherv(const TensorView& input, const TensorView& output,
                     const std::vector<int64_t>& counts, const ExecContext& ctx,
                     const AllgatherOptions& options) override {
    const int n = size(), me = rank();
    const TensorView own_slot = check_allgatherv(input, output, counts, me, n);
    check(input, ctx, "allgather input", options.label);
    check(output, ctx, "allgather output", options.label);
    const ncclDataType_t t = nccl_dtype(input.dtype);
    return state_->enqueue(
        "allgatherv", "ncclGroupEnd", options, &ctx, {input, output}, shape(input),
        [&](ncclComm_t comm, cudaStream_t stream) {
          copy_async(input, own_slot, stream, options.label);
          // Rank p sends its input to every other rank when counts[p] > 0.
          group_calls(options.label, [&] {
            int64_t offset = 0;
            for (int p = 0; p < n; ++p) {
              const int64_t c = counts[static_cast<size_t>(p)];
              if (p != me && input.numel > 0)
                state_->check_nccl(ncclSend(input.data, count_of(input), t, p, comm, stream),
                                   "ncclSend", options.label);
              if (p != me && c > 0)
                state_->check_nccl(ncclRecv(byte_offset(output.data, offset, output.dtype),
                                            static_cast<size_t>(c), t, p, comm, stream),
                                   "ncclRecv", options.label);
              offset += c;
            }
          });
        });
  }

  WorkPtr broadcast(const TensorView& data, const ExecContext& ctx,
                    const BroadcastOptions& options) override {
    check_broadcast(data, options, size());
    check(data, ctx, "broadcast tensor", options.label);
    const ncclDataType_t t = nccl_dtype(data.dtype);
    return state_->enqueue("broadcast", "ncclBroadcast", options, &ctx, {data},
                           detail::concat(shape(data), ", root ", options.root),
                           [&](ncclComm_t comm, cudaStream_t stream) {
                             if (data.numel == 0) return;
                             state_->check_nccl(ncclBroadcast(data.data, data.data, count_of(data),
                                                              t, options.root, comm, stream),
                                                "ncclBroadcast", options.label);
                           });
  }

  WorkPtr alltoall(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                   const AlltoallOptions& options) override {
    const int n = size();
    check_alltoall(input, n);
    const std::vector<int64_t> counts(static_cast<size_t>(n), input.numel / n);
    return alltoallv(input, counts, output, counts, ctx, options);
  }

  WorkPtr alltoallv(const TensorView& input, const std::vector<int64_t>& send_counts,
                    const TensorView& output, const std::vector<int64_t>& recv_counts,
                    const ExecContext& ctx, const AlltoallOptions& options) override {
    const int n = size(), me = rank();
    check_alltoallv(input, send_counts, output, recv_counts, n);
    check(input, ctx, "alltoall input", options.label);
    check(output, ctx, "alltoall output", options.label);
    const ncclDataType_t t = nccl_dtype(input.dtype);
    return state_->enqueue(
        "alltoallv", "ncclGroupEnd", options, &ctx, {input, output}, shape(input),
        [&](ncclComm_t comm, cudaStream_t stream) {
          std::vector<int64_t> send_at(static_cast<size_t>(n) + 1, 0),
              recv_at(static_cast<size_t>(n) + 1, 0);
          for (size_t p = 0; p < static_cast<size_t>(n); ++p) {
            send_at[p + 1] = send_at[p] + send_counts[p];
            recv_at[p + 1] = recv_at[p] + recv_counts[p];
          }
          const auto own = static_cast<size_t>(me);
          copy_async(input.slice(send_at[own], send_counts[own]),
                     output.slice(recv_at[own], recv_counts[own]), stream, options.label);
          group_calls(options.label, [&] {
            for (int p = 0; p < n; ++p) {
              const auto q = static_cast<size_t>(p);
              if (p == me) continue;
              if (send_counts[q] > 0)
                state_->check_nccl(
                    ncclSend(byte_offset(input.data, send_at[q], input.dtype),
                             static_cast<size_t>(send_counts[q]), t, p, comm, stream),
                    "ncclSend", options.label);
              if (recv_counts[q] > 0)
                state_->check_nccl(
                    ncclRecv(byte_offset(output.data, recv_at[q], output.dtype),
                             static_cast<size_t>(recv_counts[q]), t, p, comm, stream),
                    "ncclRecv", options.label);
            }
          });
        });
  }

  WorkPtr barrier(const BarrierOptions& options) override {
    void* token = state_->barrier_buffer();
    return state_->enqueue(
        "barrier", "ncclAllReduce", options, nullptr, {}, "one int32",
        [&](ncclComm_t comm, cudaStream_t stream) {
          state_->check_nccl(ncclAllReduce(token, token, 1, ncclInt32, ncclMax, comm, stream),
                             "ncclAllReduce", options.label.empty() ? "barrier" : options.label);
        });
  }

  WorkPtr compute(std::function<void()> fn, const OpOptions& options) override {
    state_->throw_if_poisoned("compute");
    std::weak_ptr<NcclState> weak = state_;
    auto guarded = [weak, fn = std::move(fn)] {
      if (auto state = weak.lock()) state->throw_if_poisoned("compute");
      fn();
    };
    if (options.after) {
      // On the thread that completes `after`; its failure fails this Work.
      return options.after->then(
          [guarded](const Work& done) {
            if (!done.exception()) guarded();
          },
          detail::concat("compute after ", options.after->description()));
    }
    auto work = std::make_shared<Work>(
        options.label.empty() ? std::string("compute") : "compute '" + options.label + "'",
        timeout_);
    state_->post([work, guarded] {
      std::exception_ptr error;
      try {
        guarded();
      } catch (...) {
        error = std::current_exception();
      }
      work->complete(std::move(error));
    });
    return work;
  }

 private:
  void check(const TensorView& t, const ExecContext& ctx, const char* what,
             const std::string& label) const {
    check_device_tensor(state_->who(), what, label, t, ctx, state_->device());
  }

  // ncclGroupStart, `calls`, ncclGroupEnd: the group is closed when a call throws.
  void group_calls(const std::string& label, const std::function<void()>& calls) {
    state_->check_nccl(ncclGroupStart(), "ncclGroupStart", label);
    try {
      calls();
    } catch (...) {
      (void)ncclGroupEnd();
      throw;
    }
    state_->check_nccl(ncclGroupEnd(), "ncclGroupEnd", label);
  }

  void copy_async(const TensorView& from, const TensorView& to, cudaStream_t stream,
                  const std::string& label) {
    if (from.nbytes() == 0 || from.data == to.data) return;
    RELAXCC_CUDA_CHECK(
        cudaMemcpyAsync(to.data, from.data, from.nbytes(), cudaMemcpyDeviceToDevice, stream),
        state_->who(), "cudaMemcpyAsync", label);
  }

  // The NCCL communicator over a host sub-communicator, or that host
  // communicator itself when it spans nodes and cross-node traffic goes over MPI.
  CommunicatorPtr derive(const CommunicatorPtr& host) {
    if (!host) return nullptr;
    if (options_.cross_node == CrossNodeTransport::mpi &&
        host->split_node_local()->size() != host->size())
      return host;
    return make_nccl_communicator(host, state_->device(), options_, timeout_);
  }

  std::shared_ptr<NcclState> state_;
  CommunicatorPtr host_;
  NcclCommunicatorOptions options_;
  milliseconds timeout_;
};

CommunicatorPtr make_nccl_communicator(CommunicatorPtr host, int device,
                                       const NcclCommunicatorOptions& options,
                                       milliseconds timeout) {
  const int rank = host->rank(), size = host->size();
  // Rank 0's ncclUniqueId, after a byte that says whether it could make one.
  auto message = std::make_shared<std::array<unsigned char, 1 + sizeof(ncclUniqueId)>>();
  message->fill(0);
  std::string root_error;
  if (rank == 0) {
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r == ncclSuccess) {
      (*message)[0] = 1;
      std::memcpy(message->data() + 1, &id, sizeof id);
    } else {
      root_error = ncclGetErrorString(r);
    }
  }
  BroadcastOptions broadcast;
  broadcast.root = 0;
  broadcast.label = "ncclUniqueId";
  host->broadcast(TensorView(message->data(), static_cast<int64_t>(message->size()), DType::u8,
                             Device::host(), message),
                  ExecContext::host(), broadcast)
      ->wait(timeout);
  RELAXCC_ENFORCE((*message)[0] == 1, DeviceError, "rank ", rank, " (", Device::cuda(device),
                  "): ncclGetUniqueId failed on rank 0",
                  root_error.empty() ? std::string() : ": " + root_error);
  ncclUniqueId id;
  std::memcpy(&id, message->data() + 1, sizeof id);
  auto state = std::make_shared<NcclState>(rank, size, device, options.tunables, timeout);
  state->init(id);
  return std::make_shared<NcclCommunicator>(std::move(state), std::move(host), options, timeout);
}

}  // namespace
}  // namespace relaxcc::nccl

namespace relaxcc {

CommunicatorPtr create_nccl_communicator(const NcclCommunicatorOptions& options) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  RELAXCC_ENFORCE(e == cudaSuccess && devices > 0, Unsupported,
                  "create_nccl_communicator: no usable CUDA device (",
                  e != cudaSuccess ? nccl::cuda_message(e) : std::string("no device is visible"),
                  ")");
  const std::chrono::milliseconds timeout =
      options.timeout.count() >= 0 ? options.timeout
                                   : std::chrono::milliseconds(options.tunables.timeout_ms);
  CommunicatorPtr host = options.bootstrap;
  if (!host) {
    MpiCommunicatorOptions mpi;
    mpi.comm = options.comm;
    mpi.tunables = options.tunables;
    mpi.timeout = timeout;
    host = create_mpi_communicator(mpi);
  }
  RELAXCC_ENFORCE(dynamic_cast<const nccl::NcclCommunicator*>(host.get()) == nullptr,
                  InvalidArgument,
                  "create_nccl_communicator: the bootstrap must be a host (MPI) communicator");
  int device = options.device;
  if (device < 0) {
    const int local = host->split_node_local()->rank();
    RELAXCC_ENFORCE(local < devices, Unsupported, "rank ", host->rank(),
                    ": create_nccl_communicator: this rank is rank ", local,
                    " of its node, but only ", devices,
                    " CUDA device(s) are visible (NCCL needs one device per rank; pass "
                    "NcclCommunicatorOptions::device)");
    device = local;
  }
  RELAXCC_ENFORCE(device < devices, InvalidArgument, "rank ", host->rank(),
                  ": create_nccl_communicator: device ", device, " out of range: ", devices,
                  " CUDA device(s) are visible");
  return nccl::make_nccl_communicator(std::move(host), device, options, timeout);
}

}  // namespace relaxcc
