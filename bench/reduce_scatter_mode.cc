// `relaxcc-bench reduce_scatter`: reduce-scatter implementations side by side
// on the same sizes in the same run (sweep.h). The size is the input; each
// rank gets 1/n of it reduced. busbw = algbw * (n-1)/n, as in nccl-tests.
#include <algorithm>
#include <memory>
#include <vector>

#include "bench_util.h"
#include "modes.h"
#include "relaxcc/errors.h"
#include "relaxcc/reduce_op.h"
#include "sweep.h"

namespace relaxcc::bench {

namespace {

struct ReduceScatterArgs {
  SweepArgs sweep;
  std::string op = "sum";
};

struct ScatterImpl {
  std::string name, algo;
  ReduceScatterFn run;
  // Where the input comes from; empty: ordinary host memory.
  std::function<TensorView(int64_t numel, DType dtype)> allocate;
};

ScatterImpl make_impl(const std::string& name, BenchWorld& world) {
  if (name == "mpi") return {"mpi", "MPI_Reduce_scatter_block", mpi_reduce_scatter_fn(world), {}};
  RELAXCC_ENFORCE(name == "relaxcc" || name == "relaxcc-shared", InvalidArgument,
                  "unknown --impl '", name, "': expected relaxcc, relaxcc-shared or mpi");
  CommunicatorPtr comm = relaxcc_communicator(world);
  ScatterImpl impl{name,
                   name == "relaxcc" ? "ring" : "ring (shared)",
                   [comm](const TensorView& in, const TensorView& out, ReduceOp op) {
                     ReduceScatterOptions o;
                     o.op = op;
                     comm->reduce_scatter(in, out, ExecContext::host(), o)->wait();
                   },
                   {}};
  if (name == "relaxcc-shared")
    impl.allocate = [comm](int64_t numel, DType dtype) { return comm->allocate(numel, dtype); };
  return impl;
}

SweepImpl sweep_impl(ScatterImpl scatter, ReduceOp op, const BenchWorld& world) {
  const int rank = world.rank, ranks = world.size;
  const std::string algo = scatter.algo;
  SweepImpl impl{scatter.name, [algo](int64_t) { return algo; }, {}};
  impl.prepare = [scatter, op, rank, ranks](int64_t count, DType dtype) {
    const int64_t per_rank = count / ranks;
    const TensorView in = scatter.allocate ? scatter.allocate(per_rank * ranks, dtype)
                                           : host_buffer(per_rank * ranks, dtype);
    const TensorView out = host_buffer(per_rank, dtype);
    const auto refill = encoded_refill(in, rank);
    return SweepCase{[scatter, in, out, op] { scatter.run(in, out, op); },
                     [scatter, in, out, op, rank, ranks, per_rank, refill] {
                       refill();
                       scatter.run(in, out, op);
                       return count_wrong(out, op, ranks, rank * per_rank);
                     },
                     refill};
  };
  return impl;
}

void run_reduce_scatter(const ReduceScatterArgs& args) {
  BenchWorld world;
  world.transport = args.sweep.transport;
  const ReduceOp op = parse_reduce_op(args.op);
  std::vector<SweepImpl> impls;
  for (const auto& name : args.sweep.impls)
    impls.push_back(sweep_impl(make_impl(name, world), op, world));
  const double bus_factor = world.size > 1 ? static_cast<double>(world.size - 1) / world.size : 0.0;
  run_sweep(args.sweep, world, {"reduce_scatter", std::string(reduce_op_name(op)), bus_factor},
            impls);
}

}  // namespace

void add_reduce_scatter_mode(CLI::App& app) {
  auto args = std::make_shared<ReduceScatterArgs>();
  CLI::App* sub = app.add_subcommand("reduce_scatter", "Reduce-scatter sweep, nccl-tests style");
  sub->add_option("-o,--op", args->op, "sum, avg, min, max")->capture_default_str();
  add_sweep_options(sub, args->sweep,
                    "Implementations to compare: relaxcc, relaxcc-shared (input from "
                    "Communicator::allocate), mpi (MPI_Reduce_scatter_block)");
  sub->callback([args] { run_reduce_scatter(*args); });
}

}  // namespace relaxcc::bench
