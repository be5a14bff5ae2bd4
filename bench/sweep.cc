#include "sweep.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>

#include "relaxcc/errors.h"
#include "relaxcc/tunables.h"
#include "report.h"

namespace relaxcc::bench {

void add_sweep_options(CLI::App* sub, SweepArgs& args, const std::string& impl_help) {
  sub->add_option("-b,--minbytes", args.min_bytes, "Smallest message (bytes, K/M/G)")
      ->capture_default_str();
  sub->add_option("-e,--maxbytes", args.max_bytes, "Largest message")->capture_default_str();
  sub->add_option("-f,--stepfactor", args.factor, "Multiply the size by this each step")
      ->capture_default_str();
  sub->add_option("-n,--iters", args.iters, "Timed iterations per size")->capture_default_str();
  sub->add_option("-w,--warmup_iters", args.warmup, "Untimed iterations first")
      ->capture_default_str();
  sub->add_option("-c,--check", args.check, "Check results (0/1)")->capture_default_str();
  sub->add_option("-d,--datatype", args.dtype, "f32, f16, bf16, f64, i32, i64, u8")
      ->capture_default_str();
  sub->add_option("--impl", args.impls, impl_help)->delimiter(',')->capture_default_str();
  sub->add_option("--json", args.json, "Append JSON Lines rows to this file");
  add_transport_option(sub, args.transport);
  // A later flag overrides an earlier one (scripts pass defaults, users append).
  for (CLI::Option* opt : sub->get_options())
    if (opt->get_name() != "--impl") opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

void run_sweep(const SweepArgs& args, BenchWorld& world, const SweepCollective& collective,
               const std::vector<SweepImpl>& impls) {
  Report report(world.rank == 0, args.json);
  const DType dtype = parse_dtype(args.dtype);
  const int64_t lo = parse_size(args.min_bytes), hi = parse_size(args.max_bytes);
  RELAXCC_ENFORCE(lo > 0 && hi >= lo && args.factor >= 2, InvalidArgument, "bad sweep -b ",
                  args.min_bytes, " -e ", args.max_bytes, " -f ", args.factor);
  report.print(detail::concat("# relaxcc-bench ", collective.mode, ": ", world.size,
                              " ranks, dtype ", dtype, ", op ", collective.redop, ", ", args.iters,
                              " iterations (", args.warmup,
                              " warmup), time = max over ranks of the median iteration, "
                              "implementations taking turns"));
  char line[256];
  std::snprintf(line, sizeof line, "%12s %12s %6s %6s %5s %14s %24s %12s %10s %10s %8s", "size",
                "count", "type", "redop", "place", "impl", "algo", "time(us)", "algbw(GB/s)",
                "busbw(GB/s)", "#wrong");
  report.print(line);

  const auto esize = static_cast<int64_t>(dtype_size(dtype));
  double busbw_sum = 0;
  int rows = 0;
  for (int64_t bytes = lo; bytes <= hi; bytes *= args.factor) {
    const int64_t count = bytes / esize;
    std::vector<SweepCase> cases;
    std::vector<std::vector<double>> times(impls.size());
    for (const SweepImpl& impl : impls) cases.push_back(impl.prepare(count, dtype));
    for (int i = 0; i < args.warmup; ++i)
      for (SweepCase& c : cases) {
        if (c.reset) c.reset();
        c.run();
      }
    for (int i = 0; i < args.iters; ++i) {
      for (size_t k = 0; k < cases.size(); ++k) {
        if (cases[k].reset) cases[k].reset();
        world.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        cases[k].run();
        times[k].push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count());
      }
    }
    for (size_t k = 0; k < impls.size(); ++k) {
      const SweepImpl& impl = impls[k];
      const double time_us = world.max_over_ranks(median(times[k]));
      const int64_t wrong = args.check ? world.sum_over_ranks(cases[k].check()) : 0;
      const double algbw = static_cast<double>(count * esize) / time_us / 1e3;
      const double busbw = algbw * collective.bus_factor;
      busbw_sum += busbw;
      ++rows;
      const std::string algo = impl.algo(count * esize);
      std::snprintf(line, sizeof line,
                    "%12lld %12lld %6s %6s %5s %14s %24s %12.1f %10.3f %10.3f %8lld",
                    static_cast<long long>(count * esize), static_cast<long long>(count),
                    std::string(dtype_name(dtype)).c_str(), collective.redop.c_str(),
                    impl.in_place ? "in" : "out", impl.name.c_str(), algo.c_str(), time_us, algbw,
                    busbw, static_cast<long long>(wrong));
      report.print(line);
      report.add(Row()
                     .set("mode", collective.mode)
                     .set("op", collective.redop)
                     .set("impl", impl.name)
                     .set("place", impl.in_place ? "in" : "out")
                     .set("algo", algo)
                     .set("dtype", std::string(dtype_name(dtype)))
                     .set("ranks", world.size)
                     .set("bytes", count * esize)
                     .set("count", count)
                     .set("time_us", time_us)
                     .set("algbw_gbps", algbw)
                     .set("busbw_gbps", busbw)
                     .set("wrong", wrong));
    }
  }
  report.print(detail::concat("# Avg bus bandwidth : ", rows ? busbw_sum / rows : 0.0, " GB/s"));
}

}  // namespace relaxcc::bench
