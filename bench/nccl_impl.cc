#include "nccl_impl.h"

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <memory>

#include "relaxcc/errors.h"
#include "relaxcc/kernels/cuda_runtime.h"
#include "relaxcc/nccl_communicator.h"
#include "src/nccl/nccl_types.h"

namespace relaxcc::bench {

using nccl::nccl_dtype;
using nccl::nccl_op;

namespace {

void cuda_check(cudaError_t e, const char* call) {
  RELAXCC_ENFORCE(e == cudaSuccess, DeviceError, "relaxcc-bench: ", call, ": ",
                  cudaGetErrorString(e));
}

void nccl_check(ncclResult_t r, const char* call) {
  RELAXCC_ENFORCE(r == ncclSuccess, DeviceError, "relaxcc-bench: ", call, ": ",
                  ncclGetErrorString(r));
}

// This rank's index among the ranks of its node: its GPU.
int node_local_rank() {
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  int rank = 0;
  MPI_Comm_rank(local, &rank);
  MPI_Comm_free(&local);
  return rank;
}

// ncclAllReduce's own communicator and stream, as nccl-tests sets them up.
struct BareNccl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  ~BareNccl() {
    if (comm) (void)ncclCommDestroy(comm);
    if (stream) (void)cudaStreamDestroy(stream);
  }
};

TensorView device_buffer(int64_t numel, DType dtype, int device) {
  if (numel == 0) return TensorView(nullptr, 0, dtype, Device::cuda(device));
  void* data = nullptr;
  cuda_check(cudaMalloc(&data, static_cast<size_t>(numel) * dtype_size(dtype)), "cudaMalloc");
  std::shared_ptr<void> owner(data, [](void* p) { (void)cudaFree(p); });
  return TensorView(data, numel, dtype, Device::cuda(device), std::move(owner));
}

void copy(void* to, const void* from, size_t bytes, cudaMemcpyKind kind) {
  if (bytes > 0) cuda_check(cudaMemcpy(to, from, bytes, kind), "cudaMemcpy");
}

}  // namespace

bool is_nccl_impl(const std::string& name) {
  return name == "nccl" || name == "relaxcc-nccl";
}

SweepImpl make_nccl_sweep_impl(const std::string& name, bool in_place, ReduceOp op,
                               BenchWorld& world) {
  RELAXCC_ENFORCE(is_nccl_impl(name), InvalidArgument, "unknown device --impl '", name, "'");
  const kernels::CudaAvailability cuda = kernels::cuda_availability();
  const int device = node_local_rank();
  RELAXCC_ENFORCE(device < cuda.device_count, Unsupported, "--impl ", name, ": rank ", world.rank,
                  " needs CUDA device ", device, " of its node (one GPU per rank): ",
                  cuda.device_count == 0 ? cuda.reason
                                         : detail::concat("only ", cuda.device_count, " visible"));
  cuda_check(cudaSetDevice(device), "cudaSetDevice");

  using RunFn = std::function<void(const TensorView&, const TensorView&)>;
  using AllocateFn = std::function<TensorView(int64_t, DType)>;
  RunFn run;
  AllocateFn allocate;
  std::string algo;
  if (name == "nccl") {
    auto bare = std::make_shared<BareNccl>();
    ncclUniqueId id;
    if (world.rank == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, MPI_COMM_WORLD);
    nccl_check(ncclCommInitRank(&bare->comm, world.size, id, world.rank), "ncclCommInitRank");
    cuda_check(cudaStreamCreateWithFlags(&bare->stream, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags");
    world.keep_alive.push_back(bare);
    run = [bare, op](const TensorView& input, const TensorView& output) {
      nccl_check(ncclAllReduce(input.data, output.data, static_cast<size_t>(output.numel),
                               nccl_dtype(output.dtype), nccl_op(op), bare->comm, bare->stream),
                 "ncclAllReduce");
      cuda_check(cudaStreamSynchronize(bare->stream), "cudaStreamSynchronize");
    };
    allocate = [device](int64_t numel, DType dtype) { return device_buffer(numel, dtype, device); };
    algo = "ncclAllReduce";
  } else {
    NcclCommunicatorOptions options;
    options.bootstrap = relaxcc_communicator(world);
    options.tunables = world.tunables;
    options.device = device;
    CommunicatorPtr comm = create_nccl_communicator(options);
    world.keep_alive.push_back(comm);
    // The caller's stream, that each operation is ordered after.
    cudaStream_t raw = nullptr;
    cuda_check(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    std::shared_ptr<void> stream(
        raw, [](void* s) { (void)cudaStreamDestroy(static_cast<cudaStream_t>(s)); });
    world.keep_alive.push_back(stream);
    run = [comm, stream, op](const TensorView& input, const TensorView& output) {
      AllreduceOptions o;
      o.op = op;
      ExecContext ctx;
      ctx.device = output.device;
      ctx.stream = stream.get();
      comm->allreduce(input, output, ctx, o)->wait();
    };
    // The same cudaMalloc buffers as the bare path: the two differ only in
    // the calls that drive NCCL (comm->allocate's ncclMemAlloc memory could
    // take other NCCL paths, such as buffer registration).
    allocate = [device](int64_t numel, DType dtype) { return device_buffer(numel, dtype, device); };
    algo = "NcclCommunicator";
  }

  SweepImpl impl{name, [algo](int64_t) { return algo; }, {}, in_place};
  const int rank = world.rank, ranks = world.size;
  impl.prepare = [run, allocate, in_place, op, rank, ranks](int64_t count, DType dtype) {
    const TensorView output = allocate(count, dtype);
    const TensorView input = in_place ? output : allocate(count, dtype);
    const TensorView pristine = host_buffer(count, dtype);
    fill_encoded(pristine, rank);
    // Both paths run on non-blocking streams, which do not wait for the legacy
    // default stream that cudaMemcpy and cudaMemset use, and a copy from
    // pageable memory can return before it reached the device: the device is
    // synchronized before the next allreduce reads the buffers.
    const auto refill = [input, pristine] {
      copy(input.data, pristine.data, input.nbytes(), cudaMemcpyHostToDevice);
      cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    };
    return SweepCase{[run, input, output] { run(input, output); },
                     [run, input, output, refill, in_place, op, rank, ranks] {
                       refill();
                       if (!in_place && output.nbytes() > 0)
                         cuda_check(cudaMemset(output.data, 0xff, output.nbytes()), "cudaMemset");
                       cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
                       run(input, output);
                       const TensorView result = host_buffer(output.numel, output.dtype);
                       copy(result.data, output.data, output.nbytes(), cudaMemcpyDeviceToHost);
                       int64_t wrong = count_wrong(result, op, ranks);
                       if (!in_place) {
                         const TensorView kept = host_buffer(input.numel, input.dtype);
                         copy(kept.data, input.data, input.nbytes(), cudaMemcpyDeviceToHost);
                         wrong += count_not_encoded(kept, rank);
                       }
                       return wrong;
                     },
                     refill};
  };
  return impl;
}

}  // namespace relaxcc::bench
