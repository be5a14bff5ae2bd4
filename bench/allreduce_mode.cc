// `relaxcc-bench allreduce`: allreduce implementations side by side on the
// same sizes in the same run (sweep.h), busbw = algbw * 2(n-1)/n.
#include <algorithm>
#include <memory>
#include <vector>

#include "bench_util.h"
#include "modes.h"
#include "relaxcc/reduce_op.h"
#include "sweep.h"

namespace relaxcc::bench {

namespace {

struct AllreduceArgs {
  SweepArgs sweep;
  std::string op = "sum";
  std::string algo = "auto";
};

NamedAllreduce make_impl(const std::string& name, const AllreduceArgs& args, BenchWorld& world) {
  if (name == "mpi")
    return {
        "mpi", [](int64_t) { return std::string("MPI_Allreduce"); }, mpi_allreduce_fn(world), {}};
  if (name == "p2p-ring")
    return {"p2p-ring",
            [](int64_t) { return std::string("isend/irecv ring"); },
            p2p_ring_allreduce_fn(world),
            {}};
  return make_relaxcc_allreduce(name, args.algo, world);
}

// Reduces `data` in place; the check refills it and counts wrong elements.
SweepImpl sweep_impl(NamedAllreduce named, ReduceOp op, const BenchWorld& world,
                     std::shared_ptr<std::vector<unsigned char>> buffer) {
  SweepImpl impl{named.name, named.algo, {}};
  const int rank = world.rank, ranks = world.size;
  impl.prepare = [named, op, rank, ranks, buffer](int64_t count, DType dtype) {
    TensorView data =
        named.allocate ? named.allocate(count, dtype) : TensorView{buffer->data(), count, dtype};
    fill_encoded(data, rank);
    return SweepCase{[named, data, op] { named.run(data, op); },
                     [named, data, op, ranks, rank] {
                       fill_encoded(data, rank);
                       named.run(data, op);
                       return count_wrong(data, op, ranks);
                     }};
  };
  return impl;
}

void run_allreduce(const AllreduceArgs& args) {
  BenchWorld world;
  const ReduceOp op = parse_reduce_op(args.op);
  const int64_t max_bytes = std::max<int64_t>(parse_size(args.sweep.max_bytes), 8);
  // Implementations on ordinary memory share one buffer.
  auto buffer = std::make_shared<std::vector<unsigned char>>(static_cast<size_t>(max_bytes));
  std::vector<SweepImpl> impls;
  for (const auto& name : args.sweep.impls)
    impls.push_back(sweep_impl(make_impl(name, args, world), op, world, buffer));
  const double bus_factor = world.size > 1 ? 2.0 * (world.size - 1) / world.size : 0.0;
  run_sweep(args.sweep, world, {"allreduce", std::string(reduce_op_name(op)), bus_factor}, impls);
}

}  // namespace

void add_allreduce_mode(CLI::App& app) {
  auto args = std::make_shared<AllreduceArgs>();
  CLI::App* sub = app.add_subcommand("allreduce", "Allreduce sweep, nccl-tests style");
  sub->add_option("-o,--op", args->op, "sum, avg, min, max")->capture_default_str();
  sub->add_option("--algo", args->algo,
                  "relaxcc algorithm: auto (selection table), ring, recursive_doubling")
      ->capture_default_str();
  add_sweep_options(sub, args->sweep,
                    "Implementations to compare: relaxcc, relaxcc-shared (on buffers from "
                    "Communicator::allocate), mpi (MPI_Allreduce), p2p-ring (a plain isend/irecv "
                    "ring in the calling thread)");
  sub->callback([args] { run_allreduce(*args); });
}

}  // namespace relaxcc::bench
