// `relaxcc-bench allgather`: allgather implementations side by side on the
// same sizes in the same run (sweep.h). The size is the gathered output; each
// rank contributes 1/n of it. busbw = algbw * (n-1)/n, as in nccl-tests.
#include <mpi.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "bench_util.h"
#include "modes.h"
#include "relaxcc/errors.h"
#include "sweep.h"

namespace relaxcc::bench {

namespace {

// Gathers `input` into `output` (n x input.numel elements) on this rank.
using GatherFn = std::function<void(const TensorView& input, const TensorView& output)>;

struct GatherImpl {
  std::string name, algo;
  GatherFn run;
  // Where the output comes from; empty: ordinary host memory.
  std::function<TensorView(int64_t numel, DType dtype)> allocate;
};

GatherImpl make_impl(const std::string& name, BenchWorld& world) {
  if (name == "mpi") {
    return {"mpi",
            "MPI_Allgather",
            [](const TensorView& in, const TensorView& out) {
              RELAXCC_ENFORCE_LE(in.nbytes(), size_t{INT32_MAX}, InvalidArgument,
                                 "MPI_Allgather bytes");
              const int bytes = static_cast<int>(in.nbytes());
              const int rc = MPI_Allgather(in.data, bytes, MPI_BYTE, out.data, bytes, MPI_BYTE,
                                           MPI_COMM_WORLD);
              RELAXCC_ENFORCE_EQ(rc, MPI_SUCCESS, CommunicationError, "MPI_Allgather");
            },
            {}};
  }
  RELAXCC_ENFORCE(name == "relaxcc" || name == "relaxcc-shared", InvalidArgument,
                  "unknown --impl '", name, "': expected relaxcc, relaxcc-shared or mpi");
  CommunicatorPtr comm = relaxcc_communicator(world);
  GatherImpl impl{name,
                  name == "relaxcc" ? "ring" : "ring (shared)",
                  [comm](const TensorView& in, const TensorView& out) {
                    comm->allgather(in, out, ExecContext::host())->wait();
                  },
                  {}};
  if (name == "relaxcc-shared")
    impl.allocate = [comm](int64_t numel, DType dtype) { return comm->allocate(numel, dtype); };
  return impl;
}

SweepImpl sweep_impl(GatherImpl gather, const BenchWorld& world) {
  const int rank = world.rank, ranks = world.size;
  const std::string algo = gather.algo;
  SweepImpl impl{gather.name, [algo](int64_t) { return algo; }, {}};
  impl.prepare = [gather, rank, ranks](int64_t count, DType dtype) {
    const int64_t per_rank = count / ranks;
    const TensorView in = host_buffer(per_rank, dtype);
    const TensorView out = gather.allocate ? gather.allocate(per_rank * ranks, dtype)
                                           : host_buffer(per_rank * ranks, dtype);
    const auto refill = encoded_refill(in, rank);
    return SweepCase{[gather, in, out] { gather.run(in, out); },
                     [gather, in, out, per_rank, refill] {
                       refill();
                       std::fill_n(static_cast<unsigned char*>(out.data), out.nbytes(), 0xff);
                       gather.run(in, out);
                       return per_rank > 0 ? count_wrong_gathered(out, per_rank) : 0;
                     },
                     refill};
  };
  return impl;
}

void run_allgather(const SweepArgs& args) {
  BenchWorld world;
  world.transport = args.transport;
  std::vector<SweepImpl> impls;
  for (const auto& name : args.impls) impls.push_back(sweep_impl(make_impl(name, world), world));
  const double bus_factor = world.size > 1 ? static_cast<double>(world.size - 1) / world.size : 0.0;
  run_sweep(args, world, {"allgather", "none", bus_factor}, impls);
}

}  // namespace

void add_allgather_mode(CLI::App& app) {
  auto args = std::make_shared<SweepArgs>();
  CLI::App* sub = app.add_subcommand("allgather", "Allgather sweep, nccl-tests style");
  add_sweep_options(sub, *args,
                    "Implementations to compare: relaxcc, relaxcc-shared (output from "
                    "Communicator::allocate), mpi (MPI_Allgather)");
  sub->callback([args] { run_allgather(*args); });
}

}  // namespace relaxcc::bench
