// `relaxcc-bench allreduce`: times allreduce implementations side by side on
// the same sizes in the same run, as nccl-tests does.
//
// Time per size is the median over iterations on each rank, then the maximum
// over ranks. Implementations take turns iteration by iteration, so that
// each sees the same spells of machine noise (on a shared VM, steal time
// comes and goes in bursts of milliseconds). algbw = bytes / time;
// busbw = algbw * 2(n-1)/n.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "bench_util.h"
#include "modes.h"
#include "relaxcc/dtype.h"
#include "relaxcc/errors.h"
#include "relaxcc/reduce_op.h"
#include "report.h"

namespace relaxcc::bench {

namespace {

struct AllreduceArgs {
  std::string min_bytes = "1K", max_bytes = "64M";
  int factor = 2;
  int iters = 20, warmup = 5;
  int check = 1;
  std::string dtype = "f32", op = "sum";
  std::vector<std::string> impls{"mpi"};
  std::string algo = "auto";
  std::string json;
};

// One allreduce implementation under test: `run` reduces `data` in place and
// returns when the result is complete on this rank.
using Impl = NamedAllreduce;

Impl make_impl(const std::string& name, const AllreduceArgs& args, BenchWorld& world) {
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

void run_allreduce(const AllreduceArgs& args) {
  BenchWorld world;
  Report report(world.rank == 0, args.json);
  const DType dtype = parse_dtype(args.dtype);
  const ReduceOp op = parse_reduce_op(args.op);
  const int64_t lo = parse_size(args.min_bytes), hi = parse_size(args.max_bytes);
  RELAXCC_ENFORCE(lo > 0 && hi >= lo && args.factor >= 2, InvalidArgument,
                  "bad sweep -b ", args.min_bytes, " -e ", args.max_bytes, " -f ", args.factor);
  std::vector<Impl> impls;
  for (const auto& name : args.impls) impls.push_back(make_impl(name, args, world));

  report.print(detail::concat("# relaxcc-bench allreduce: ", world.size, " ranks, dtype ", dtype,
                              ", op ", op, ", ", args.iters, " iterations (", args.warmup,
                              " warmup), time = max over ranks of the median iteration"));
  char line[256];
  std::snprintf(line, sizeof line, "%12s %12s %6s %6s %10s %20s %12s %10s %10s %8s", "size",
                "count", "type", "redop", "impl", "algo", "time(us)", "algbw(GB/s)",
                "busbw(GB/s)", "#wrong");
  report.print(line);

  const size_t esize = dtype_size(dtype);
  const int64_t max_count = hi / static_cast<int64_t>(esize);
  std::vector<unsigned char> buffer(static_cast<size_t>(std::max<int64_t>(max_count, 1)) * esize);
  const double bus_factor = world.size > 1 ? 2.0 * (world.size - 1) / world.size : 0.0;
  double busbw_sum = 0;
  int rows = 0;
  for (int64_t bytes = lo; bytes <= hi; bytes *= args.factor) {
    const int64_t count = bytes / static_cast<int64_t>(esize);
    std::vector<TensorView> data(impls.size());
    std::vector<std::vector<double>> times(impls.size());
    for (size_t k = 0; k < impls.size(); ++k) {
      data[k] = impls[k].allocate ? impls[k].allocate(count, dtype)
                                  : TensorView{buffer.data(), count, dtype};
      fill_encoded(data[k], world.rank);
    }
    for (int i = 0; i < args.warmup; ++i)
      for (size_t k = 0; k < impls.size(); ++k) impls[k].run(data[k], op);
    for (int i = 0; i < args.iters; ++i) {
      for (size_t k = 0; k < impls.size(); ++k) {
        MPI_Barrier(MPI_COMM_WORLD);
        const auto t0 = std::chrono::steady_clock::now();
        impls[k].run(data[k], op);
        times[k].push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count());
      }
    }
    for (size_t k = 0; k < impls.size(); ++k) {
      const Impl& impl = impls[k];
      const double time_us = world.max_over_ranks(median(times[k]));
      int64_t wrong = 0;
      if (args.check) {
        fill_encoded(data[k], world.rank);
        impl.run(data[k], op);
        wrong = world.sum_over_ranks(count_wrong(data[k], op, world.size));
      }
      const double algbw = static_cast<double>(count * esize) / time_us / 1e3;
      const double busbw = algbw * bus_factor;
      busbw_sum += busbw;
      ++rows;
      std::snprintf(line, sizeof line, "%12lld %12lld %6s %6s %10s %20s %12.1f %10.3f %10.3f %8lld",
                    static_cast<long long>(count * esize), static_cast<long long>(count),
                    std::string(dtype_name(dtype)).c_str(), std::string(reduce_op_name(op)).c_str(),
                    impl.name.c_str(), impl.algo(count * static_cast<int64_t>(esize)).c_str(), time_us, algbw, busbw,
                    static_cast<long long>(wrong));
      report.print(line);
      report.add(Row()
                     .set("mode", "allreduce")
                     .set("op", std::string(reduce_op_name(op)))
                     .set("impl", impl.name)
                     .set("algo", impl.algo(count * static_cast<int64_t>(esize)))
                     .set("dtype", std::string(dtype_name(dtype)))
                     .set("ranks", world.size)
                     .set("bytes", count * static_cast<int64_t>(esize))
                     .set("count", count)
                     .set("time_us", time_us)
                     .set("algbw_gbps", algbw)
                     .set("busbw_gbps", busbw)
                     .set("wrong", wrong));
    }
  }
  report.print(detail::concat("# Avg bus bandwidth : ", rows ? busbw_sum / rows : 0.0, " GB/s"));
}

}  // namespace

void add_allreduce_mode(CLI::App& app) {
  auto args = std::make_shared<AllreduceArgs>();
  CLI::App* sub = app.add_subcommand("allreduce", "Allreduce sweep, nccl-tests style");
  sub->add_option("-b,--minbytes", args->min_bytes, "Smallest message (bytes, K/M/G)")
      ->capture_default_str();
  sub->add_option("-e,--maxbytes", args->max_bytes, "Largest message")->capture_default_str();
  sub->add_option("-f,--stepfactor", args->factor, "Multiply the size by this each step")
      ->capture_default_str();
  sub->add_option("-n,--iters", args->iters, "Timed iterations per size")->capture_default_str();
  sub->add_option("-w,--warmup_iters", args->warmup, "Untimed iterations first")
      ->capture_default_str();
  sub->add_option("-c,--check", args->check, "Check results (0/1)")->capture_default_str();
  sub->add_option("-d,--datatype", args->dtype, "f32, f16, bf16, f64, i32, i64, u8")
      ->capture_default_str();
  sub->add_option("-o,--op", args->op, "sum, avg, min, max")->capture_default_str();
  sub->add_option("--impl", args->impls,
                  "Implementations to compare: relaxcc, relaxcc-shared (on buffers from "
                  "Communicator::allocate), mpi (MPI_Allreduce), p2p-ring (a plain isend/irecv "
                  "ring in the calling thread)")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--algo", args->algo,
                  "relaxcc algorithm: auto (selection table), ring, recursive_doubling")
      ->capture_default_str();
  sub->add_option("--json", args->json, "Append JSON Lines rows to this file");
  // A later flag overrides an earlier one (scripts pass defaults, users append).
  for (CLI::Option* opt : sub->get_options())
    if (opt->get_name() != "--impl") opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  sub->callback([args] { run_allreduce(*args); });
}

}  // namespace relaxcc::bench
