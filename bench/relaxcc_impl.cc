#include <mpi.h>

#include <numeric>

#include "bench_util.h"
#include "relaxcc/errors.h"

namespace relaxcc::bench {

CommunicatorPtr relaxcc_communicator(BenchWorld& world) {
  if (!world.relaxcc_root) {
    world.relaxcc_root = create_communicator(world, world.transport, world.tunables);
    return world.relaxcc_root;
  }
  // Each further implementation: a group of every rank, on the same engine
  // (and the same node-shared memory), with tags and sequence numbers of its own.
  std::vector<int> everyone(static_cast<size_t>(world.relaxcc_root->size()));
  std::iota(everyone.begin(), everyone.end(), 0);
  GroupOptions g;
  g.key = ++world.relaxcc_groups;
  CommunicatorPtr comm = world.relaxcc_root->group(everyone, g);
  world.keep_alive.push_back(comm);
  return comm;
}

NamedAllreduce make_relaxcc_allreduce(const std::string& impl, const std::string& algo,
                                      BenchWorld& world) {
  RELAXCC_ENFORCE(impl == "relaxcc" || impl == "relaxcc-shared" || impl == "relaxcc-ucx",
                  InvalidArgument, "unknown --impl '", impl,
                  "': expected relaxcc, relaxcc-shared, relaxcc-ucx, mpi, p2p-ring, nccl or "
                  "relaxcc-nccl");
  // relaxcc-ucx beside relaxcc over MPI: a UCX communicator of its own; with
  // --transport ucx it is one more group of the UCX root, as relaxcc is.
  const bool own_ucx = impl == "relaxcc-ucx" && world.transport != "ucx";
  if (own_ucx && !world.ucx_root)
    world.ucx_root = create_communicator(world, "ucx", world.tunables);
  CommunicatorPtr comm = own_ucx ? world.ucx_root : relaxcc_communicator(world);
  AllreduceOptions ar;
  ar.algo = parse_allreduce_algo(algo);
  const auto table = AllreduceSelection::parse(world.tunables.allreduce_algo);
  const bool shared = impl == "relaxcc-shared";
  auto algo_at = [ar, table, shared](int64_t bytes) {
    const AllreduceAlgo a = ar.algo == AllreduceAlgo::automatic ? table.pick(bytes) : ar.algo;
    return std::string(allreduce_algo_name(a)) +
           (shared && a == AllreduceAlgo::ring ? " (shared)" : "");
  };
  NamedAllreduce named{impl,
                       algo_at,
                       [comm, ar](const TensorView& input, const TensorView& output, ReduceOp op) {
                         AllreduceOptions o = ar;
                         o.op = op;
                         comm->allreduce(input, output, ExecContext::host(), o)->wait();
                       },
                       {}};
  if (shared)
    named.allocate = [comm](int64_t numel, DType dtype) { return comm->allocate(numel, dtype); };
  return named;
}

}  // namespace relaxcc::bench
