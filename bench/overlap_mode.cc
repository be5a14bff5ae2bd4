// `relaxcc-bench overlap`: how much of the gradient communication the
// Reducer hides behind backward. A synthetic backward produces the gradients
// of a real model's layers (ResNet-50, BERT-base) in reverse order, with
// per-layer compute emulated by sleeping (a GPU leaves the host CPU free) or
// by spinning (busy). Per step, the maximum over ranks, median over steps:
//   (a) compute only, (b) compute then communication, (c) relaxcc overlapped,
//   timed with their steps alternating (a, b, c, a, b, c, ...);
//   overlap efficiency = (b - c) / min(compute, communication).
// --bucket-tuner adds the BucketTuner's choice against an exhaustive sweep of all 13
// caps in the same run; the tuned cap and the sweep's best are then timed with
// alternating steps.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "model_layers.h"
#include "modes.h"
#include "relaxcc/algorithms/gradient_allreduce.h"
#include "relaxcc/errors.h"
#include "relaxcc/mpi_communicator.h"
#include "relaxcc/reducer.h"
#include "relaxcc/tunables.h"
#include "report.h"

namespace relaxcc::bench {

namespace {

using Clock = std::chrono::steady_clock;

struct OverlapArgs {
  std::string transport = "mpi";
  std::vector<std::string> models{"resnet50", "bert-base"};
  std::vector<std::string> compute{"sleep", "busy"};
  double compute_ms = 0;     // 0: equal to the measured communication time
  std::string cap = "25M";   // bucket cap of the a/b/c rows (PyTorch DDP's default)
  bool bucket_view = false;  // gradient_as_bucket_view
  int iters = 8, warmup = 2;
  bool tune = false;
  std::string json;
};

struct Job {
  std::vector<Layer> layers;
  std::vector<std::vector<float>> grads;
  std::vector<TensorSpec> specs;
  int64_t total = 0;
};

Job make_job(const std::string& model, int rank) {
  Job j;
  j.layers = model_layers(model);
  for (const Layer& l : j.layers) {
    j.grads.emplace_back(static_cast<size_t>(l.numel), static_cast<float>(rank + 1));
    j.total += l.numel;
  }
  for (size_t i = 0; i < j.layers.size(); ++i)
    j.specs.push_back({j.layers[i].name, TensorView::host(j.grads[i].data(), j.layers[i].numel)});
  return j;
}

// Waits until `deadline`, sleeping or spinning.
void compute_until(Clock::time_point deadline, bool busy) {
  if (busy) {
    while (Clock::now() < deadline) {
    }
  } else {
    std::this_thread::sleep_until(deadline);
  }
}

// One synthetic backward: layer i (last first) computes for its share of
// compute_ms, then (when overlapping) its gradient is marked ready.
void backward(const Job& job, double compute_ms, bool busy, Reducer* overlap) {
  const auto start = Clock::now();
  double done_ms = 0;
  for (int i = static_cast<int>(job.layers.size()) - 1; i >= 0; --i) {
    done_ms +=
        compute_ms * static_cast<double>(job.layers[i].numel) / static_cast<double>(job.total);
    compute_until(start + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double, std::milli>(done_ms)),
                  busy);
    if (overlap) overlap->mark_ready(i);
  }
}

void communicate_all(Reducer& r, const Job& job) {
  for (int i = static_cast<int>(job.layers.size()) - 1; i >= 0; --i) r.mark_ready(i);
}

// Steps of each function in turn (a, b, c, a, b, c, ...), so that all see
// the same machine state; returns each one's median (max over ranks).
std::vector<double> interleaved_step_ms(BenchWorld& world, int warmup, int iters,
                                        const std::vector<std::function<void()>>& fns) {
  std::vector<std::vector<double>> times(fns.size());
  for (int i = 0; i < warmup + iters; ++i) {
    for (size_t k = 0; k < fns.size(); ++k) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = Clock::now();
      fns[k]();
      if (i >= warmup)
        times[k].push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
  }
  std::vector<double> out;
  for (const auto& t : times) out.push_back(world.max_over_ranks(median(t)));
  return out;
}

// Median step time (max over ranks) of one function.
template <typename Fn>
double step_ms(BenchWorld& world, int warmup, int iters, Fn&& step) {
  return interleaved_step_ms(world, warmup, iters, {std::forward<Fn>(step)})[0];
}

std::unique_ptr<Reducer> make_reducer(CommunicatorPtr comm, const Job& job, ReducerOptions o) {
  return std::make_unique<Reducer>(
      comm, job.specs, std::make_shared<algorithms::GradientAllreduce>(), ExecContext::host(), o);
}

void run_overlap(const OverlapArgs& args) {
  BenchWorld world;
  world.transport = args.transport;
  Report report(world.rank == 0, args.json);
  CommunicatorPtr comm = create_communicator(world, world.transport, world.tunables);
  report.print(detail::concat("# relaxcc-bench overlap: ", world.size,
                              " ranks, gradient_allreduce, bucket cap ", args.cap,
                              ", times are the max over ranks of the median step"));
  char line[320];
  std::snprintf(line, sizeof line, "%-10s %-6s %12s %12s %12s %12s %12s %10s", "model", "kind",
                "params", "compute(ms)", "comm(ms)", "serial(ms)", "overlap(ms)", "efficiency");
  report.print(line);
  for (const std::string& model : args.models) {
    Job job = make_job(model, world.rank);
    ReducerOptions plain;
    plain.plan.cap_bytes = parse_size(args.cap);
    plain.plan.first_cap_bytes = std::min(plain.plan.first_cap_bytes, plain.plan.cap_bytes);
    plain.gradient_as_bucket_view = args.bucket_view;
    auto reducer = make_reducer(comm, job, plain);
    const double comm_ms = step_ms(world, args.warmup, args.iters, [&] {
      reducer->begin_step();
      communicate_all(*reducer, job);
      reducer->synchronize();
    });
    const double compute_ms = args.compute_ms > 0 ? args.compute_ms : comm_ms;
    for (const std::string& kind : args.compute) {
      RELAXCC_ENFORCE(kind == "sleep" || kind == "busy", InvalidArgument,
                      "overlap: --compute sleep or busy, got ", kind);
      const bool busy = kind == "busy";
      const std::vector<double> abc =
          interleaved_step_ms(world, args.warmup, args.iters,
                              {[&] { backward(job, compute_ms, busy, nullptr); },
                               [&] {
                                 backward(job, compute_ms, busy, nullptr);
                                 reducer->begin_step();
                                 communicate_all(*reducer, job);
                                 reducer->synchronize();
                               },
                               [&] {
                                 reducer->begin_step();
                                 backward(job, compute_ms, busy, reducer.get());
                                 reducer->synchronize();
                               }});
      const double a = abc[0], b = abc[1], c = abc[2];
      const double comm_part = b - a;
      const double efficiency = (b - c) / std::max(1e-9, std::min(a, comm_part));
      std::snprintf(line, sizeof line, "%-10s %-6s %12lld %12.1f %12.1f %12.1f %12.1f %10.3f",
                    model.c_str(), kind.c_str(), static_cast<long long>(job.total), a, comm_part, b,
                    c, efficiency);
      report.print(line);
      report.add(Row()
                     .set("mode", "overlap")
                     .set("model", model)
                     .set("compute_kind", kind)
                     .set("ranks", world.size)
                     .set("cap_bytes", parse_size(args.cap))
                     .set("bucket_view", args.bucket_view ? 1 : 0)
                     .set("params", job.total)
                     .set("compute_ms", a)
                     .set("comm_ms", comm_part)
                     .set("serial_ms", b)
                     .set("overlapped_ms", c)
                     .set("overlap_efficiency", efficiency));
    }
    if (!args.tune) continue;
    // The tuner against an exhaustive sweep of its 13 candidate caps.
    auto overlapped_step = [&](Reducer& r) {
      r.begin_step();
      backward(job, compute_ms, false, &r);
      r.synchronize();
    };
    ReducerOptions tuned;
    tuned.auto_tune_buckets = true;
    auto t = make_reducer(comm, job, tuned);
    int guard = 0;
    while (!t->tuner()->done() && guard++ < 64) overlapped_step(*t);
    const int64_t tuned_cap = t->tuner()->current_cap();
    double sweep_best_ms = 1e300;
    int64_t best_cap = 0;
    std::unique_ptr<Reducer> best;
    for (int64_t cap : BucketTuner::candidate_caps()) {
      ReducerOptions o;
      o.plan.cap_bytes = cap;
      o.plan.first_cap_bytes = std::min<int64_t>(o.plan.first_cap_bytes, cap);
      auto r = make_reducer(comm, job, o);
      const double ms = step_ms(world, args.warmup, args.iters, [&] { overlapped_step(*r); });
      report.print(detail::concat("#   sweep: cap ", format_bytes(cap), " -> ", ms, " ms"));
      if (ms < sweep_best_ms) {
        sweep_best_ms = ms;
        best_cap = cap;
        best = std::move(r);
      }
    }
    // The sweep's minimum of 13 noisy medians is biased low; the tuned cap
    // and the sweep's best are compared by alternating their steps.
    const std::vector<double> pair = interleaved_step_ms(
        world, 1, 2 * args.iters, {[&] { overlapped_step(*t); }, [&] { overlapped_step(*best); }});
    const double tuned_ms = pair[0], best_ms = pair[1];
    report.print(detail::concat("# tuner (", model, ", sleep compute): cap ",
                                format_bytes(tuned_cap), " -> ", tuned_ms, " ms; sweep best: cap ",
                                format_bytes(best_cap), " -> ", best_ms, " ms (alternating steps; ",
                                sweep_best_ms, " ms in the sweep); ratio ", tuned_ms / best_ms));
    report.add(Row()
                   .set("mode", "overlap_tuner")
                   .set("model", model)
                   .set("compute_kind", "sleep")
                   .set("ranks", world.size)
                   .set("tuned_cap_bytes", tuned_cap)
                   .set("tuned_step_ms", tuned_ms)
                   .set("best_cap_bytes", best_cap)
                   .set("best_step_ms", best_ms)
                   .set("sweep_best_step_ms", sweep_best_ms));
  }
}

}  // namespace

void add_overlap_mode(CLI::App& app) {
  auto args = std::make_shared<OverlapArgs>();
  CLI::App* sub = app.add_subcommand("overlap", "Communication hidden behind a synthetic backward");
  sub->add_option("--model", args->models, "resnet50, bert-base")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--compute", args->compute, "sleep (GPU-like: host idle) and/or busy")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--compute-ms", args->compute_ms,
                  "Backward compute per step; 0 = the measured communication time")
      ->capture_default_str();
  sub->add_option("--cap", args->cap, "Bucket cap of the compute/serial/overlapped rows")
      ->capture_default_str();
  sub->add_flag("--bucket-view", args->bucket_view, "Gradients live in bucket memory (no copies)");
  sub->add_option("-n,--iters", args->iters, "Timed steps")->capture_default_str();
  sub->add_option("-w,--warmup_iters", args->warmup, "Untimed steps first")->capture_default_str();
  // Not "--tune": mpirun takes that for its own option even after the program.
  sub->add_flag("--bucket-tuner", args->tune,
                "Add the BucketTuner against an exhaustive sweep of its 13 caps");
  sub->add_option("--json", args->json, "Append JSON Lines rows to this file");
  add_transport_option(sub, args->transport);
  sub->callback([args] { run_overlap(*args); });
}

}  // namespace relaxcc::bench
