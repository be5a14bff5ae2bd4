#include <mpi.h>

#include "bench_util.h"
#include "relaxcc/errors.h"
#include "relaxcc/mpi_communicator.h"

namespace relaxcc::bench {

NamedAllreduce make_relaxcc_allreduce(const std::string& impl, const std::string& algo,
                                      BenchWorld& world) {
  RELAXCC_ENFORCE(impl == "relaxcc", InvalidArgument, "unknown --impl '", impl,
                  "': expected relaxcc, mpi or p2p-ring");
  MpiCommunicatorOptions options;
  options.comm = MPI_COMM_WORLD;
  options.tunables = world.tunables;
  CommunicatorPtr comm = create_mpi_communicator(options);
  world.keep_alive.push_back(comm);
  AllreduceOptions ar;
  ar.algo = parse_allreduce_algo(algo);
  const auto table = AllreduceSelection::parse(world.tunables.allreduce_algo);
  auto algo_at = [ar, table](int64_t bytes) {
    return std::string(allreduce_algo_name(ar.algo == AllreduceAlgo::automatic ? table.pick(bytes) : ar.algo));
  };
  return {"relaxcc", algo_at, [comm, ar](const TensorView& data, ReduceOp op) {
            AllreduceOptions o = ar;
            o.op = op;
            comm->allreduce(data, ExecContext::host(), o)->wait();
          }};
}

}  // namespace relaxcc::bench
