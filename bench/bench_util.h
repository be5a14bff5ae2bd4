// Shared pieces of relaxcc-bench modes: the MPI world, statistics, test data
// that encodes rank and index, and the implementations under test.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "relaxcc/communicator.h"
#include "relaxcc/reduce_op.h"
#include "relaxcc/store.h"
#include "relaxcc/tensor.h"
#include "relaxcc/tunables.h"

namespace CLI {
class App;
}

namespace relaxcc::bench {

// Initializes MPI at MPI_THREAD_MULTIPLE if nobody has, and finalizes it on
// destruction if it did.
class BenchWorld {
 public:
  // Under mpirun: MPI's world. Started without mpirun (no Open MPI or PMIx
  // rank in the environment, a rendezvous named by RELAXCC_RENDEZVOUS or
  // MASTER_ADDR/MASTER_PORT, RANK and WORLD_SIZE): the ranks of that
  // rendezvous, with a UCX control communicator for the bench's own
  // reductions and barriers, when `without_mpirun` (the mode needs no MPI
  // baseline); InvalidArgument otherwise.
  explicit BenchWorld(bool without_mpirun = false);
  ~BenchWorld();
  BenchWorld(const BenchWorld&) = delete;
  BenchWorld& operator=(const BenchWorld&) = delete;

  double max_over_ranks(double v) const;
  int64_t sum_over_ranks(int64_t v) const;
  void barrier() const;
  // Whether MPI runs (false: started without mpirun).
  bool mpi() const { return mpi_; }

  int rank = 0;
  int size = 1;
  Tunables tunables;
  // Implementations that need per-run state (a communicator) keep it here.
  std::vector<std::shared_ptr<void>> keep_alive;
  // The first relaxcc communicator; later implementations get groups of it
  // over every rank (relaxcc_communicator), so one engine thread serves them.
  CommunicatorPtr relaxcc_root;
  uint64_t relaxcc_groups = 0;
  // The wing of relaxcc's communicators (--transport): "mpi" or "ucx".
  std::string transport = "mpi";
  // The "relaxcc-ucx" implementation's communicator, beside relaxcc_root.
  CommunicatorPtr ucx_root;
  // The UCX wing's rendezvous store under mpirun, and the generation of the
  // next creation on it.
  std::shared_ptr<Store> ucx_store;
  uint64_t ucx_generation = 0;
  // Started without mpirun: the communicator of the bench's reductions.
  CommunicatorPtr control;

 private:
  bool mpi_ = true;
  bool owns_mpi_ = false;
};

// --transport mpi|ucx on a mode's subcommand (the wing of its relaxcc
// communicators).
void add_transport_option(CLI::App* sub, std::string& transport);

// A relaxcc communicator over every rank on `transport`'s wing, the one
// place the bench picks a factory. mpi: create_mpi_communicator on
// MPI_COMM_WORLD. ucx: create_ucx_communicator; from the environment when
// it names a rendezvous (RELAXCC_RENDEZVOUS or MASTER_ADDR), otherwise over
// a store rank 0 serves on 127.0.0.1 at a port it picks and broadcasts over
// MPI_COMM_WORLD (kept in the world, one generation per creation).
// InvalidArgument for another name.
CommunicatorPtr create_communicator(BenchWorld& world, const std::string& transport,
                                    const Tunables& tunables);

double median(std::vector<double> v);

// `numel` elements of ordinary host memory that the view owns.
TensorView host_buffer(int64_t numel, DType dtype);

// element i on rank r = (r + i) % 4, exactly representable in every dtype.
void fill_encoded(const TensorView& t, int rank);
// Elements that differ from the exact allreduce of fill_encoded over `ranks`
// (t's element 0 being element `first_index` of the full result).
int64_t count_wrong(const TensorView& t, ReduceOp op, int ranks, int64_t first_index = 0);
// Elements that differ from the allgather of fill_encoded inputs of
// `per_rank` (> 0) elements each.
int64_t count_wrong_gathered(const TensorView& t, int64_t per_rank);

// Writes fill_encoded(t, rank) into t when called, at memcpy speed (a copy
// of data encoded once).
std::function<void()> encoded_refill(const TensorView& t, int rank);
// Elements of `t` that differ from fill_encoded(t, rank).
int64_t count_not_encoded(const TensorView& t, int rank);

// Allreduce of input into output; in place when both are the same view.
using AllreduceFn =
    std::function<void(const TensorView& input, const TensorView& output, ReduceOp op)>;
// MPI_Allreduce on MPI_COMM_WORLD, MPI_IN_PLACE when in place (f16/bf16
// through an f32 user op; avg as sum, then a local division).
AllreduceFn mpi_allreduce_fn(BenchWorld& world);
using ReduceScatterFn =
    std::function<void(const TensorView& input, const TensorView& output, ReduceOp op)>;
// MPI_Reduce_scatter_block on MPI_COMM_WORLD (ops as mpi_allreduce_fn).
ReduceScatterFn mpi_reduce_scatter_fn(BenchWorld& world);
// The reference point for relaxcc's engine overhead: a plain pipelined ring
// (reduce-scatter, then allgather) over MPI_Isend/MPI_Irecv in the calling
// thread, segments of tunables.segment_bytes, on MPI_COMM_WORLD. No header,
// no mismatch detection, no timeout.
AllreduceFn p2p_ring_allreduce_fn(BenchWorld& world);

struct NamedAllreduce {
  std::string name;
  std::function<std::string(int64_t bytes)> algo;  // the algorithm used at a size
  AllreduceFn run;
  // Where its buffers come from; empty: ordinary host memory.
  std::function<TensorView(int64_t numel, DType dtype)> allocate;
};
// A relaxcc communicator over MPI_COMM_WORLD with the world's tunables, kept
// alive by the world: the first call creates it, later calls return groups
// of it over every rank, so all implementations share one engine thread.
CommunicatorPtr relaxcc_communicator(BenchWorld& world);

// relaxcc's allreduce on a communicator over MPI_COMM_WORLD, with `algo`
// forced ("auto" uses the selection table): "relaxcc" on ordinary memory,
// "relaxcc-shared" on buffers from Communicator::allocate (node-shared
// memory when the ranks share a node), both on world.transport's wing;
// "relaxcc-ucx" on the UCX wing whatever --transport says (beside the
// others in one run: the wings' ratio). Throws InvalidArgument for an unknown
// implementation name.
NamedAllreduce make_relaxcc_allreduce(const std::string& impl, const std::string& algo,
                                      BenchWorld& world);

}  // namespace relaxcc::bench
