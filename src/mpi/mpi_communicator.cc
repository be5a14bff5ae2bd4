#include "relaxcc/mpi_communicator.h"

#include <sched.h>

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>

#include "../collectives/mpi_collective.h"
#include "../collectives/point_to_point.h"
#include "../collectives/recursive_doubling.h"
#include "../collectives/ring.h"
#include "engine.h"
#include "op_header.h"
#include "relaxcc/config.h"
#include "relaxcc/errors.h"
#include "relaxcc/logging.h"
#include "shared_memory.h"

namespace relaxcc {
namespace mpi {
namespace {

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void ensure_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = 0;
  if (!initialized) {
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    std::atexit(finalize_at_exit);
  } else {
    MPI_Query_thread(&provided);
  }
  RELAXCC_ENFORCE(provided >= MPI_THREAD_MULTIPLE, Unsupported,
                  "relaxcc needs MPI_THREAD_MULTIPLE, MPI provides thread level ", provided,
                  " (initialize MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...))");
}

// Creation runs before any engine exists, so it waits on the caller thread.
void timed_barrier(MPI_Comm comm, std::chrono::milliseconds timeout, const char* what) {
  MPI_Request req;
  check_mpi(MPI_Ibarrier(comm, &req), "MPI_Ibarrier");
  const auto deadline = Clock::now() + timeout;
  int64_t sleep_us = 1;
  for (;;) {
    int flag = 0;
    check_mpi(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (flag) return;
    RELAXCC_ENFORCE(Clock::now() < deadline, Timeout, what, ": not every rank arrived within ",
                    timeout.count(), " ms (the barrier request stays parked)");
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    sleep_us = std::min<int64_t>(sleep_us * 2, 1000);
  }
}

void check_host(const TensorView& t, const ExecContext& ctx, const char* what) {
  t.check_valid(what);
  RELAXCC_ENFORCE(static_cast<int>(t.dtype) < kNumDTypes, InvalidArgument, what, ": unknown dtype ",
                  static_cast<int>(t.dtype));
  RELAXCC_ENFORCE(t.device.is_host() && ctx.device.is_host(), Unsupported, what, " on ", t.device,
                  ": the MPI communicator moves host memory (device tensors go through NCCL)");
}

void check_op(ReduceOp op, const char* what) {
  RELAXCC_ENFORCE(static_cast<int>(op) <= static_cast<int>(ReduceOp::max), InvalidArgument, what,
                  ": unknown reduce op ", static_cast<int>(op));
}

std::vector<int64_t> balanced_chunks(int64_t numel, int n) {
  std::vector<int64_t> counts(n, numel / n);
  for (int c = 0; c < numel % n; ++c) ++counts[c];
  return counts;
}

// Ranks of `comm` that share this rank's node. Collective over `comm`.
int node_local_size(MPI_Comm comm) {
  MPI_Comm local = MPI_COMM_NULL;
  int rank = 0, local_size = 1;
  MPI_Comm_rank(comm, &rank);
  check_mpi(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local),
            "MPI_Comm_split_type");
  MPI_Comm_size(local, &local_size);
  MPI_Comm_free(&local);
  return local_size;
}

// Whether all `size` ranks share one node (`local_size` of them share this
// rank's), as topology sees it: RELAXCC_RANKS_PER_NODE can split one machine
// into several nodes.
bool on_one_node(int size, int local_size, int64_t ranks_per_node) {
  if (ranks_per_node > 0 && ranks_per_node < size) return false;
  return local_size == size;
}

uint64_t handshake_hash(const Tunables& t) {
  uint64_t h = t.agreement_hash();
  for (DType d : kAllDTypes) h = h * 1099511628211ull + dtype_size(d);
  return h * 1099511628211ull + sizeof(void*);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm coll, MPI_Comm p2p, Tunables tunables, Engine::Polling polling,
                  bool one_node)
      : selection_(AllreduceSelection::parse(tunables.allreduce_algo)),
        polling_(polling),
        shared_memory_(one_node ? std::make_shared<SharedMemory>() : nullptr),
        engine_(std::make_shared<Engine>(coll, p2p, std::move(tunables), polling)) {}

  int rank() const override { return engine_->rank(); }
  int size() const override { return engine_->size(); }
  bool poisoned() const override { return engine_->poisoned(); }
  CommStats stats() const override { return engine_->stats(); }
  int max_p2p_tag() const override { return (engine_->max_tag() - 1) / 2; }

  void handshake(std::chrono::milliseconds timeout) {
    OpHeader h;
    h.type = OpType::handshake;
    h.count = build::kVersion;
    h.layout = handshake_hash(engine_->tunables());
    auto work = engine_->submit(
        std::make_shared<MpiCollectiveOp>("handshake", 0, "library version, dtype sizes, Agree tunables",
                                          std::vector<OpHeader>(size(), h), nullptr),
        "all ranks");
    work->wait(timeout);
  }

  CommunicatorPtr split(int color, int key, const SplitOptions& options) override {
    return split_impl(options, "split", [color, key](MPI_Comm coll, MPI_Comm* out) {
      check_mpi(MPI_Comm_split(coll, color < 0 ? MPI_UNDEFINED : color, key, out), "MPI_Comm_split");
    });
  }

  CommunicatorPtr split_node_local(const SplitOptions& options) override {
    return split_impl(options, "split_node_local", [](MPI_Comm coll, MPI_Comm* out) {
      int r = 0;
      MPI_Comm_rank(coll, &r);
      check_mpi(MPI_Comm_split_type(coll, MPI_COMM_TYPE_SHARED, r, MPI_INFO_NULL, out),
                "MPI_Comm_split_type");
    });
  }

  TensorView allocate(int64_t numel, DType dtype) override {
    RELAXCC_ENFORCE(static_cast<int>(dtype) < kNumDTypes, InvalidArgument,
                    "allocate: unknown dtype ", static_cast<int>(dtype));
    RELAXCC_ENFORCE(numel >= 0, InvalidArgument, "allocate: negative element count ", numel);
    if (shared_memory_) return shared_memory_->allocate(numel, dtype);
    auto memory = std::make_shared<std::vector<unsigned char>>(static_cast<size_t>(numel) *
                                                               dtype_size(dtype));
    return TensorView(memory->data(), numel, dtype, Device::host(), memory);
  }

  WorkPtr point_to_point(const std::vector<P2POp>& ops, const ExecContext& ctx,
                         const P2POptions& options) override {
    for (const P2POp& op : ops) {
      check_host(op.tensor, ctx, "point_to_point tensor");
      RELAXCC_ENFORCE(op.peer >= 0 && op.peer < size(), InvalidArgument, "point_to_point: peer ",
                      op.peer, " is not a rank of this communicator of ", size());
      RELAXCC_ENFORCE(op.tag >= 0 && op.tag <= max_p2p_tag(), InvalidArgument,
                      "point_to_point: tag ", op.tag, " outside [0, ", max_p2p_tag(), "]");
    }
    return submit(std::make_shared<P2PBatchOp>(ops, options.priority, options.label), options,
                  detail::concat(ops.size(), " ops"));
  }

  using Communicator::allreduce;
  WorkPtr allreduce(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                    const AllreduceOptions& options) override {
    check_host(input, ctx, "allreduce input");
    check_host(output, ctx, "allreduce output");
    check_op(options.op, "allreduce");
    RELAXCC_ENFORCE_EQ(input.dtype, output.dtype, InvalidArgument,
                       "allreduce: input and output dtypes");
    RELAXCC_ENFORCE_EQ(input.numel, output.numel, InvalidArgument,
                       "allreduce: input and output elements");
    const bool in_place = input.data == output.data;
    RELAXCC_ENFORCE(in_place || !overlap(input, output), InvalidArgument,
                    "allreduce: input and output overlap without being the same view");
    const int n = size();
    AllreduceAlgo algo = options.algo;
    if (algo == AllreduceAlgo::automatic)
      algo = selection_.pick(static_cast<int64_t>(output.nbytes()));
    // One rank and recursive doubling work in place.
    if (n == 1) return completed("allreduce", options, [input, output] { copy(input, output); });
    if (algo == AllreduceAlgo::recursive_doubling) {
      return submit(std::make_shared<RecursiveDoublingOp>("allreduce", options.priority, options.label,
                                                          output, options.op, rank(), n, ctx,
                                                          static_cast<int>(algo)),
                    options,
                    detail::concat("recursive_doubling, ", output.numel, " x ",
                                   dtype_name(output.dtype), ", all ranks"),
                    [input, output] { copy(input, output); });
    }
    RingSpec spec = ring_spec(OpType::allreduce, output.dtype, balanced_chunks(output.numel, n));
    spec.op = options.op;
    spec.local = input;
    spec.gathered = output;
    const int64_t offset = std::accumulate(spec.chunk_counts.begin(), spec.chunk_counts.begin() + rank(), int64_t{0});
    spec.result = output.slice(offset, spec.chunk_counts[rank()]);
    share(spec, output);
    return submit_ring("allreduce", options, std::move(spec), ctx, output);
  }

  WorkPtr reduce_scatter(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                         const ReduceScatterOptions& options) override {
    check_host(input, ctx, "reduce_scatter input");
    check_host(output, ctx, "reduce_scatter output");
    check_op(options.op, "reduce_scatter");
    const int n = size();
    RELAXCC_ENFORCE_EQ(input.dtype, output.dtype, InvalidArgument, "reduce_scatter: input and output dtypes");
    RELAXCC_ENFORCE_EQ(input.numel, output.numel * n, InvalidArgument,
                       "reduce_scatter: input elements must be size() x output elements");
    if (n == 1) return completed("reduce_scatter", options, [input, output] { copy(input, output); });
    RingSpec spec = ring_spec(OpType::reduce_scatter, input.dtype, std::vector<int64_t>(n, output.numel));
    spec.gather_phase = false;
    spec.op = options.op;
    spec.local = input;
    spec.result = output;
    share(spec, input);
    // Partial sums that the right neighbour reads go to node-shared scratch.
    // Without it this rank runs privately: its peers see a PeerMismatch
    // instead of waiting.
    if (spec.shared.pid != 0 && n > 2) {
      try {
        spec.partials = shared_memory_->acquire_scratch(input.nbytes());
      } catch (const CommunicationError& e) {
        RELAXCC_LOG(warn, "rank ", rank(),
                    ": reduce_scatter on a shared input runs privately: ", e.message());
        spec.shared = SharedRef{};
        spec.shared_memory = nullptr;
      }
    }
    return submit_ring("reduce_scatter", options, std::move(spec), ctx, input);
  }

  WorkPtr allgather(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                    const AllgatherOptions& options) override {
    return allgatherv(input, output, std::vector<int64_t>(size(), input.numel), ctx, options);
  }

  WorkPtr allgatherv(const TensorView& input, const TensorView& output,
                     const std::vector<int64_t>& counts, const ExecContext& ctx,
                     const AllgatherOptions& options) override {
    check_host(input, ctx, "allgather input");
    check_host(output, ctx, "allgather output");
    const int n = size();
    RELAXCC_ENFORCE_EQ(input.dtype, output.dtype, InvalidArgument, "allgather: input and output dtypes");
    RELAXCC_ENFORCE_EQ(static_cast<int>(counts.size()), n, InvalidArgument, "allgatherv: one count per rank");
    for (int64_t c : counts) RELAXCC_ENFORCE_GE(c, 0, InvalidArgument, "allgatherv: counts");
    RELAXCC_ENFORCE_EQ(counts[rank()], input.numel, InvalidArgument,
                       "allgatherv: counts[rank()] must equal the input elements");
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    RELAXCC_ENFORCE_EQ(output.numel, total, InvalidArgument, "allgather: output elements must be the sum of counts");
    const int64_t offset = std::accumulate(counts.begin(), counts.begin() + rank(), int64_t{0});
    auto copy_own = [input, slot = output.slice(offset, input.numel)] { copy(input, slot); };
    if (n == 1) return completed("allgather", options, copy_own);
    RingSpec spec = ring_spec(OpType::allgather, input.dtype, counts);
    spec.reduce_phase = false;
    spec.gathered = output;
    share(spec, output);
    return submit_ring("allgather", options, std::move(spec), ctx, output, copy_own);
  }

  WorkPtr broadcast(const TensorView& data, const ExecContext& ctx,
                    const BroadcastOptions& options) override {
    check_host(data, ctx, "broadcast tensor");
    RELAXCC_ENFORCE(options.root >= 0 && options.root < size(), InvalidArgument, "broadcast: root ",
                    options.root, " is not a rank of this communicator of ", size());
    const int bytes = checked_int(data.nbytes(), "broadcast");
    OpHeader h = header(OpType::broadcast, data);
    h.root = options.root;
    TensorView keep = data;
    const int root = options.root;
    return submit_mpi("broadcast", options, std::vector<OpHeader>(size(), h),
                      [keep, bytes, root](MPI_Comm comm) {
                        MPI_Request req;
                        check_mpi(MPI_Ibcast(keep.data, bytes, MPI_BYTE, root, comm, &req), "MPI_Ibcast");
                        return req;
                      },
                      detail::concat("root ", root, ", ", data.numel, " x ", dtype_name(data.dtype)));
  }

  WorkPtr alltoall(const TensorView& input, const TensorView& output, const ExecContext& ctx,
                   const AlltoallOptions& options) override {
    const int n = size();
    RELAXCC_ENFORCE(input.numel % n == 0, InvalidArgument, "alltoall: ", input.numel,
                    " input elements do not split into ", n, " blocks");
    const std::vector<int64_t> counts(n, input.numel / n);
    return alltoallv(input, counts, output, counts, ctx, options);
  }

  WorkPtr alltoallv(const TensorView& input, const std::vector<int64_t>& send_counts,
                    const TensorView& output, const std::vector<int64_t>& recv_counts,
                    const ExecContext& ctx, const AlltoallOptions& options) override {
    check_host(input, ctx, "alltoall input");
    check_host(output, ctx, "alltoall output");
    const int n = size();
    RELAXCC_ENFORCE_EQ(input.dtype, output.dtype, InvalidArgument, "alltoall: input and output dtypes");
    RELAXCC_ENFORCE(static_cast<int>(send_counts.size()) == n && static_cast<int>(recv_counts.size()) == n,
                    InvalidArgument, "alltoallv: one send and one receive count per rank");
    const int64_t esize = static_cast<int64_t>(dtype_size(input.dtype));
    struct Layout {
      std::vector<int> scounts, sdispls, rcounts, rdispls;
    };
    auto layout = std::make_shared<Layout>();
    int64_t soff = 0, roff = 0;
    std::vector<OpHeader> headers(n, header(OpType::alltoall, input));
    for (int p = 0; p < n; ++p) {
      RELAXCC_ENFORCE(send_counts[p] >= 0 && recv_counts[p] >= 0, InvalidArgument, "alltoallv: counts");
      layout->scounts.push_back(checked_int(send_counts[p] * esize, "alltoallv"));
      layout->sdispls.push_back(checked_int(soff * esize, "alltoallv"));
      layout->rcounts.push_back(checked_int(recv_counts[p] * esize, "alltoallv"));
      layout->rdispls.push_back(checked_int(roff * esize, "alltoallv"));
      soff += send_counts[p];
      roff += recv_counts[p];
      headers[p].count = 0;
      headers[p].to_peer = send_counts[p];
      headers[p].from_peer = recv_counts[p];
    }
    RELAXCC_ENFORCE_EQ(soff, input.numel, InvalidArgument, "alltoallv: input elements vs sum of send_counts");
    RELAXCC_ENFORCE_EQ(roff, output.numel, InvalidArgument, "alltoallv: output elements vs sum of recv_counts");
    TensorView in = input, out = output;
    return submit_mpi("alltoall", options, std::move(headers),
                      [in, out, layout](MPI_Comm comm) {
                        MPI_Request req;
                        check_mpi(MPI_Ialltoallv(in.data, layout->scounts.data(), layout->sdispls.data(),
                                                 MPI_BYTE, out.data, layout->rcounts.data(),
                                                 layout->rdispls.data(), MPI_BYTE, comm, &req),
                                  "MPI_Ialltoallv");
                        return req;
                      },
                      detail::concat(input.numel, " x ", dtype_name(input.dtype), " out"));
  }

  WorkPtr barrier(const BarrierOptions& options) override {
    OpHeader h;
    h.type = OpType::barrier;
    return submit_mpi("barrier", options, std::vector<OpHeader>(size(), h), nullptr, "all ranks");
  }

 private:
  static int checked_int(int64_t v, const char* what) {
    RELAXCC_ENFORCE(v >= 0 && v <= INT32_MAX, InvalidArgument, what, ": ", v,
                    " bytes exceed what one MPI call can describe (2^31-1)");
    return static_cast<int>(v);
  }

  static void copy(const TensorView& from, const TensorView& to) {
    if (from.numel > 0 && from.data != to.data) std::memmove(to.data, from.data, from.nbytes());
  }

  static bool overlap(const TensorView& a, const TensorView& b) {
    const auto* pa = static_cast<const unsigned char*>(a.data);
    const auto* pb = static_cast<const unsigned char*>(b.data);
    return a.nbytes() > 0 && b.nbytes() > 0 && pa < pb + b.nbytes() && pb < pa + a.nbytes();
  }

  static OpHeader header(OpType type, const TensorView& t) {
    OpHeader h;
    h.type = type;
    h.dtype = t.dtype;
    h.count = t.numel;
    return h;
  }

  // Shared mode when the ring's full layout lies in this node's shared memory.
  void share(RingSpec& spec, const TensorView& full) const {
    if (!shared_memory_) return;
    if (auto ref = shared_memory_->find(full.data, full.nbytes())) {
      spec.shared = *ref;
      spec.shared_memory = shared_memory_;
    }
  }

  RingSpec ring_spec(OpType type, DType dtype, std::vector<int64_t> chunks) const {
    RingSpec spec;
    spec.type = type;
    spec.dtype = dtype;
    spec.chunk_counts = std::move(chunks);
    spec.segment_bytes = std::max<int64_t>(engine_->tunables().segment_bytes, 1);
    spec.pipeline_depth = static_cast<int>(std::max<int64_t>(engine_->tunables().pipeline_depth, 1));
    spec.algo_id = static_cast<int>(AllreduceAlgo::ring);
    return spec;
  }

  // Submits `op` in the communicator's order, to start after options.after.
  // `prepare`, a local step the operation needs first, runs now when the
  // operation starts at once, else right before it starts.
  WorkPtr submit(std::shared_ptr<Operation> op, const OpOptions& options, const std::string& details,
                 std::function<void()> prepare = {}) {
    if (prepare) {
      if (options.after) op->set_prologue(std::move(prepare));
      else prepare();
    }
    return engine_->submit(std::move(op), details, options.after);
  }

  WorkPtr submit_ring(const char* name, const OpOptions& options, RingSpec spec, const ExecContext& ctx,
                      const TensorView& shown, std::function<void()> prepare = {}) {
    const int n = size(), r = rank();
    std::string details = detail::concat("ring, ", shown.numel, " x ", dtype_name(shown.dtype),
                                         ", peers ", (r - 1 + n) % n, ",", (r + 1) % n,
                                         spec.shared.pid != 0 ? ", shared buffers" : "");
    return submit(std::make_shared<RingOp>(name, options.priority, options.label, std::move(spec), r,
                                           n, ctx, std::make_unique<IdentityCodec>()),
                  options, details, std::move(prepare));
  }

  WorkPtr submit_mpi(const char* name, const OpOptions& options, std::vector<OpHeader> headers,
                     MpiCollectiveOp::Launch launch, const std::string& details,
                     MpiCollectiveOp::After after = {}) {
    return submit(std::make_shared<MpiCollectiveOp>(name, options.priority, options.label,
                                                    std::move(headers), std::move(launch),
                                                    std::move(after)),
                  options, details);
  }

  // A single rank's operation: `run` (its local copy) now, or once
  // options.after completed (if it failed, fails as Engine::start would).
  WorkPtr completed(const char* name, const OpOptions& options, std::function<void()> run) {
    RELAXCC_ENFORCE(!poisoned(), CommunicatorPoisoned, name, ": the communicator is poisoned");
    const std::string description = detail::concat(name, " (single rank)");
    if (options.after) {
      return options.after->then(
          [run = std::move(run), description](const Work& after) {
            if (std::exception_ptr e = after.exception())
              RELAXCC_THROW(CommunicationError, description, ": a stage it runs after failed: ",
                            after.description(), ": ", abort_cause(e).reason);
            run();
          },
          description);
    }
    run();
    auto work = std::make_shared<Work>(description);
    work->complete(nullptr);
    return work;
  }

  template <typename SplitFn>
  CommunicatorPtr split_impl(const SplitOptions& options, const char* name, SplitFn fn) {
    struct Result {
      MPI_Comm coll = MPI_COMM_NULL, p2p = MPI_COMM_NULL;
      bool one_node = false;
    };
    auto result = std::make_shared<Result>();
    OpHeader h;
    h.type = OpType::barrier;
    h.algo = 1;  // a split, not a plain barrier
    const int64_t ranks_per_node = engine_->tunables().ranks_per_node;
    auto work =
        submit_mpi(name, OpOptions{}, std::vector<OpHeader>(size(), h), nullptr, "timed barrier, then split",
                   [fn, result, ranks_per_node](MPI_Comm coll) {
                     fn(coll, &result->coll);
                     if (result->coll == MPI_COMM_NULL) return;
                     MPI_Comm_set_errhandler(result->coll, MPI_ERRORS_RETURN);
                     check_mpi(MPI_Comm_dup(result->coll, &result->p2p), "MPI_Comm_dup");
                     int size = 1;
                     MPI_Comm_size(result->coll, &size);
                     result->one_node =
                         on_one_node(size, node_local_size(result->coll), ranks_per_node);
                   });
    work->wait(options.timeout);
    if (result->coll == MPI_COMM_NULL) return nullptr;
    return std::make_shared<MpiCommunicator>(result->coll, result->p2p, engine_->tunables(),
                                             polling_, result->one_node);
  }

  AllreduceSelection selection_;
  Engine::Polling polling_;
  // Set when every rank shares one node; outlives the engine's operations.
  std::shared_ptr<SharedMemory> shared_memory_;
  std::shared_ptr<Engine> engine_;
};

// RELAXCC_ENGINE_POLL: sleep, yield, or auto: yield when each of the
// `local_size` ranks that share this node has a CPU (of the node's hardware
// threads, and of this process's affinity mask, which mpirun's binding
// narrows). Callers poll too only with two CPUs per rank.
Engine::Polling choose_polling(int local_size, const std::string& policy) {
  RELAXCC_ENFORCE(policy == "auto" || policy == "sleep" || policy == "yield", InvalidArgument,
                  "RELAXCC_ENGINE_POLL='", policy, "': expected auto, sleep or yield");
  unsigned cpus =
      std::max(1u, std::thread::hardware_concurrency()) / static_cast<unsigned>(local_size);
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof mask, &mask) == 0)
    cpus = std::min(cpus, static_cast<unsigned>(CPU_COUNT(&mask)));
  Engine::Polling polling;
  const bool yield = policy == "yield" || (policy == "auto" && cpus >= 1);
  polling.backoff = yield ? Engine::Backoff::yield : Engine::Backoff::sleep;
  polling.callers_poll = yield && cpus >= 2;
  return polling;
}

}  // namespace
}  // namespace mpi

CommunicatorPtr create_mpi_communicator(const MpiCommunicatorOptions& options) {
  mpi::ensure_mpi();
  const auto timeout = options.timeout.count() >= 0 ? options.timeout
                                                    : std::chrono::milliseconds(options.tunables.timeout_ms);
  // Validates the selection table before any collective call.
  AllreduceSelection::parse(options.tunables.allreduce_algo);
  mpi::timed_barrier(options.comm, timeout, "create_mpi_communicator");
  MPI_Comm coll = MPI_COMM_NULL, p2p = MPI_COMM_NULL;
  mpi::check_mpi(MPI_Comm_dup(options.comm, &coll), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(coll, MPI_ERRORS_RETURN);
  mpi::check_mpi(MPI_Comm_dup(coll, &p2p), "MPI_Comm_dup");
  int size = 1;
  MPI_Comm_size(coll, &size);
  const int local_size = mpi::node_local_size(coll);
  const auto polling = mpi::choose_polling(local_size, options.tunables.engine_poll);
  const bool one_node = mpi::on_one_node(size, local_size, options.tunables.ranks_per_node);
  auto comm =
      std::make_shared<mpi::MpiCommunicator>(coll, p2p, options.tunables, polling, one_node);
  comm->handshake(timeout);
  return comm;
}

}  // namespace relaxcc
