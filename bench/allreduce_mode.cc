// `relaxcc-bench allreduce`: allreduce implementations side by side on the
// same sizes in the same run (sweep.h), busbw = algbw * 2(n-1)/n.
#include <algorithm>
#include <memory>
#include <vector>

#include "bench_util.h"
#include "modes.h"
#include "nccl_impl.h"
#include "relaxcc/errors.h"
#include "relaxcc/reduce_op.h"
#include "sweep.h"

namespace relaxcc::bench {

namespace {

struct AllreduceArgs {
  SweepArgs sweep;
  std::string op = "sum";
  std::string algo = "auto";
  std::vector<std::string> places{"out", "in"};
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

// Ordinary host memory that the implementations on it share.
struct HostBuffers {
  std::shared_ptr<std::vector<unsigned char>> input, output;
};

// Allreduce of input into output (the same view in place), the input
// rewritten before every iteration; the check counts wrong output elements,
// plus changed input elements out of place.
SweepImpl sweep_impl(NamedAllreduce named, bool in_place, ReduceOp op, const BenchWorld& world,
                     HostBuffers buffers) {
  SweepImpl impl{named.name, named.algo, {}, in_place};
  const int rank = world.rank, ranks = world.size;
  impl.prepare = [named, in_place, op, rank, ranks, buffers](int64_t count, DType dtype) {
    auto buffer = [&](const std::shared_ptr<std::vector<unsigned char>>& memory) {
      return named.allocate ? named.allocate(count, dtype)
                            : TensorView{memory->data(), count, dtype};
    };
    const TensorView output = buffer(buffers.output);
    const TensorView input = in_place ? output : buffer(buffers.input);
    const auto refill = encoded_refill(input, rank);
    return SweepCase{
        [named, input, output, op] { named.run(input, output, op); },
        [named, input, output, op, in_place, rank, ranks, refill] {
          refill();
          if (!in_place)
            std::fill_n(static_cast<unsigned char*>(output.data), output.nbytes(), 0xff);
          named.run(input, output, op);
          return count_wrong(output, op, ranks) + (in_place ? 0 : count_not_encoded(input, rank));
        },
        refill};
  };
  return impl;
}

void run_allreduce(const AllreduceArgs& args) {
  BenchWorld world(/*without_mpirun=*/true);
  world.transport = args.sweep.transport;
  const ReduceOp op = parse_reduce_op(args.op);
  const auto max_bytes =
      static_cast<size_t>(std::max<int64_t>(parse_size(args.sweep.max_bytes), 8));
  const HostBuffers buffers{std::make_shared<std::vector<unsigned char>>(max_bytes),
                            std::make_shared<std::vector<unsigned char>>(max_bytes)};
  for (const auto& place : args.places)
    RELAXCC_ENFORCE(place == "out" || place == "in", InvalidArgument, "unknown --place '", place,
                    "': expected out or in");
  // One communicator per host implementation, for both placements; the
  // device ones (nccl_impl.h) set up their own per placement.
  std::vector<NamedAllreduce> named;
  for (const auto& name : args.sweep.impls)
    if (!is_nccl_impl(name)) named.push_back(make_impl(name, args, world));
  std::vector<SweepImpl> impls;
  for (const auto& place : args.places) {
    size_t host = 0;
    for (const auto& name : args.sweep.impls)
      impls.push_back(is_nccl_impl(name)
                          ? make_nccl_sweep_impl(name, place == "in", op, world)
                          : sweep_impl(named[host++], place == "in", op, world, buffers));
  }
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
                    "ring in the calling thread); on device buffers, one GPU per rank: nccl "
                    "(bare ncclAllReduce), relaxcc-nccl (the NCCL communicator)");
  sub->add_option("--place", args->places,
                  "Out of place (input and output buffers, MPI_Allreduce(send, recv)), in place "
                  "(one buffer, MPI_IN_PLACE), or both, as nccl-tests' two column groups")
      ->delimiter(',')
      ->capture_default_str();
  sub->callback([args] { run_allreduce(*args); });
}

}  // namespace relaxcc::bench
