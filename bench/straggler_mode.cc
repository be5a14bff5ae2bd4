// `relaxcc-bench straggler`: the relaxations that leave slow peers out
// (gossip, group averaging, asynchronous averaging and the modules built on
// them), each on a least-squares problem with a straggler that is slow from
// its first step, as users meet one.
//
// Problem: rank r minimises f_r(x) = 1/2 sum_i a_i (x_i - t_ri)^2 from
// x = 0 with noisy gradients (a_i in [0.5, 2]; t_ri a target in [-2, 2]
// shared by the ranks plus a rank's own part in [-0.05, 0.05], as shards of
// one data set differ; noise drawn from (rank, step)); the loss is F(x) - F(x*) of the global
// objective F = mean_r f_r, summed over the models of the ranks that are not the slowest at the end
// (loss_x: the slow run's over the even run's). A straggler left out of the rounds trains mostly on
// its own, and what its own model is worth is not in that figure. A step: compute (a sleep of
// compute_ms times the rank's slowdown), the gradient step, the case's averaging.
//
// Every case runs twice in one process, each time with fresh objects (no
// deadline learned before) and fresh tags: with every rank at speed 1, then
// with the --speeds given. Ranks start each run together (a barrier) and
// never meet again until it ends: no barrier after the warm-up steps, which
// are steps like the others (the straggler is slow in them too). A rank at
// speed s takes ceil((warmup + steps) / s) steps, so every rank runs about
// as long. "kept" is, over the ranks that are not the slowest, the lowest of
// (timed steps per second x speed) in the slow run over the lowest steps per
// second in the even run: 1.0 when the slow ranks cost the others nothing.
// The deadline column is the learned deadline (max over the ranks that are
// not the slowest) at the end of the slow run; left_out lists, per rank,
// how many rounds the others went on without it, and left_out_by the rounds
// in which a peer told that rank it was left out (gossip cases).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "modes.h"
#include "relaxcc/algorithms/async_model_average.h"
#include "relaxcc/algorithms/decentralized_sgd.h"
#include "relaxcc/algorithms/low_precision_decentralized_sgd.h"
#include "relaxcc/algorithms/moshpit_sgd.h"
#include "relaxcc/errors.h"
#include "relaxcc/mpi_communicator.h"
#include "relaxcc/optimizer.h"
#include "relaxcc/reducer.h"
#include "relaxcc/relaxed/async_average.h"
#include "relaxcc/relaxed/gossip.h"
#include "relaxcc/relaxed/group_average.h"
#include "report.h"

namespace relaxcc::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct StragglerArgs {
  std::string transport = "mpi";
  std::vector<std::string> cases{"gossip:shift_one",
                                 "gossip:ring",
                                 "gossip:exponential",
                                 "group_average",
                                 "async",
                                 "decentralized_sgd",
                                 "moshpit_sgd",
                                 "async_model_average",
                                 "low_precision_decentralized_sgd"};
  std::vector<double> compute_ms{20};
  std::vector<double> speeds;  // per rank; empty: the last rank 3x slower
  int steps = 120, warmup = 10;
  int64_t dim = 4096;
  float lr = 0.05f;
  double rate_mbit = 0;   // recorded in the rows (0: unshaped)
  bool per_rank = false;  // print each rank's record of its peers
  std::string json;
};

// The problem's data, drawn from (rank, index) and (rank, step, index).
uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
double unit(uint64_t z) {
  return static_cast<double>(mix64(z) >> 11) * 0x1.0p-53;
}
double curvature(int64_t i) {
  return 0.5 + 1.5 * unit(static_cast<uint64_t>(i) * 3 + 1);
}
// Data-parallel shards of one problem: a target shared by every rank and a
// small part of each rank's own.
double target(int rank, int64_t i) {
  return 4 * unit(static_cast<uint64_t>(i) * 7 + 2) - 2 +
         0.1 * (unit((static_cast<uint64_t>(rank + 1) << 40) ^ static_cast<uint64_t>(i)) - 0.5);
}

struct Problem {
  int ranks;
  int64_t dim;
  // The gradient of f_rank at x, with noise of step `step`.
  void gradient(int rank, int64_t step, const float* x, float* g) const {
    for (int64_t i = 0; i < dim; ++i) {
      const uint64_t seed = (static_cast<uint64_t>(rank) << 48) ^
                            (static_cast<uint64_t>(step) << 24) ^ static_cast<uint64_t>(i);
      const double noise = unit(seed * 5 + 3) - 0.5;
      g[i] = static_cast<float>(curvature(i) * (x[i] - target(rank, i)) + noise);
    }
  }
  // F(x) - F(x*): F's minimiser is the mean target.
  double loss(const float* x) const {
    double sum = 0;
    for (int64_t i = 0; i < dim; ++i) {
      double mean = 0;
      for (int r = 0; r < ranks; ++r) mean += target(r, i);
      mean /= ranks;
      const double d = x[i] - mean;
      sum += 0.5 * curvature(i) * d * d;
    }
    return sum / static_cast<double>(dim);
  }
};

struct Outcome {
  double rate = 0;                   // timed steps per second of this rank
  double loss = 0;                   // of this rank's model
  double deadline_ms = 0;            // learned, at the end (0: none)
  std::vector<int64_t> left_out;     // per peer, by this rank
  std::vector<int64_t> left_out_by;  // per peer, told to this rank
};

void add_deadline(Outcome& out, const AdaptiveDeadline* d, int ranks, bool print, int rank) {
  out.left_out.assign(static_cast<size_t>(ranks), 0);
  if (d == nullptr) return;
  if (print)
    for (const AdaptiveDeadline::PeerRecord& p : d->peers())
      std::printf("#   rank %d: peer %d arrived %lld left out %lld%s median %.2f ms\n", rank,
                  p.peer, static_cast<long long>(p.arrived), static_cast<long long>(p.left_out),
                  p.straggler ? " (straggler)" : "", p.median.count() / 1e3);
  out.deadline_ms = std::chrono::duration<double, std::milli>(d->current()).count();
  for (const AdaptiveDeadline::PeerRecord& p : d->peers())
    out.left_out[static_cast<size_t>(p.peer)] += p.left_out;
}

AlgorithmPtr make_module(const std::string& name, int tag) {
  if (name == "decentralized_sgd") {
    algorithms::DecentralizedSgdOptions o;
    o.mode = GossipMode::shift_one;
    o.deadline.adaptive = true;
    o.tag = tag;
    return std::make_shared<algorithms::DecentralizedSgd>(o);
  }
  if (name == "moshpit_sgd") {
    algorithms::MoshpitSgdOptions o;
    o.tag = tag;
    return std::make_shared<algorithms::MoshpitSgd>(o);
  }
  if (name == "async_model_average") {
    algorithms::AsyncModelAverageOptions o;
    o.tag = tag;
    return std::make_shared<algorithms::AsyncModelAverage>(o);
  }
  if (name == "low_precision_decentralized_sgd") {
    algorithms::LowPrecisionDecentralizedSgdOptions o;
    o.deadline.adaptive = true;
    o.tag = tag;
    return std::make_shared<algorithms::LowPrecisionDecentralizedSgd>(o);
  }
  return nullptr;
}

const AdaptiveDeadline* module_deadline(const Algorithm& a) {
  if (auto* d = dynamic_cast<const algorithms::DecentralizedSgd*>(&a)) return d->learned_deadline();
  if (auto* m = dynamic_cast<const algorithms::MoshpitSgd*>(&a)) return m->learned_deadline();
  if (auto* s = dynamic_cast<const algorithms::AsyncModelAverage*>(&a))
    return s->learned_deadline();
  if (auto* c = dynamic_cast<const algorithms::LowPrecisionDecentralizedSgd*>(&a))
    return c->learned_deadline();
  return nullptr;
}

// One run of one case on this rank.
Outcome run_case(const StragglerArgs& args, BenchWorld& world, const CommunicatorPtr& comm,
                 const std::string& name, double compute_ms, double speed, int tag, bool slow_run) {
  const bool print = args.per_rank && slow_run;
  const Problem problem{world.size, args.dim};
  const int total = static_cast<int>(std::ceil((args.warmup + args.steps) / speed - 1e-9));
  const int warmup = std::min(total - 1, static_cast<int>(std::ceil(args.warmup / speed - 1e-9)));
  const auto compute = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(compute_ms * speed));
  std::vector<float> x(static_cast<size_t>(args.dim), 0.0f), g(x.size());
  const TensorView xv = TensorView::host(x.data(), args.dim);
  Outcome out;
  RelaxedStats stats;
  std::unique_ptr<AdaptiveDeadline> adaptive;
  std::unique_ptr<AsyncModelAverager> averager;
  std::mutex lock;
  AlgorithmPtr module = make_module(name, tag);
  std::unique_ptr<Reducer> reducer;
  Sgd sgd(SgdOptions{args.lr});
  if (module) {
    std::vector<TensorSpec> specs{
        {"w.grad", TensorView::host(g.data(), args.dim), TensorRole::gradient, 1},
        {"w", xv, TensorRole::parameter}};
    reducer = std::make_unique<Reducer>(comm, specs, module, ExecContext::host());
  } else if (name == "async") {
    AsyncAverageOptions o;
    o.tag = tag;
    o.stats = &stats;
    averager = std::make_unique<AsyncModelAverager>(comm, xv, lock, o);
  } else {
    adaptive = std::make_unique<AdaptiveDeadline>();
  }
  const bool is_gossip = name.rfind("gossip:", 0) == 0;
  RELAXCC_ENFORCE(module || averager || is_gossip || name == "group_average", InvalidArgument,
                  "straggler: unknown case '", name, "'");
  const GossipMode mode = is_gossip ? parse_gossip_mode(name.substr(7)) : GossipMode::ring;
  MPI_Barrier(MPI_COMM_WORLD);
  Clock::time_point timed_start = Clock::now();
  for (int step = 0; step < total; ++step) {
    if (step == warmup) timed_start = Clock::now();
    std::this_thread::sleep_for(compute);
    if (module) {
      reducer->begin_step();
      problem.gradient(world.rank, step, x.data(), g.data());
      reducer->mark_ready(0);
      reducer->synchronize();
      reducer->optimizer_step(sgd);
      continue;
    }
    {
      std::lock_guard<std::mutex> hold(lock);
      problem.gradient(world.rank, step, x.data(), g.data());
      for (int64_t i = 0; i < args.dim; ++i) x[i] -= args.lr * g[i];
    }
    const auto round = static_cast<uint64_t>(step) + 1;
    if (averager) {
      averager->step();
    } else if (is_gossip) {
      GossipOptions o;
      o.mode = mode;
      o.round = round;
      o.tag = tag;
      o.adaptive = adaptive.get();
      o.stats = &stats;
      gossip(*comm, xv, ExecContext::host(), o)->wait(std::chrono::minutes(1));
    } else {
      GroupAverageOptions o;
      o.grid = {2, (world.size + 1) / 2};
      o.round = round;
      o.tag = tag;
      o.adaptive = adaptive.get();
      o.stats = &stats;
      group_average(*comm, xv, ExecContext::host(), o)->wait(std::chrono::minutes(1));
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - timed_start).count();
  out.rate = (total - warmup) / seconds;
  if (module) {
    add_deadline(out, module_deadline(*module), world.size, print, world.rank);
    module->shutdown(std::chrono::seconds(30));
    reducer.reset();
  } else {
    if (averager) averager->stop();
    add_deadline(out, averager ? averager->learned_deadline() : adaptive.get(), world.size, print,
                 world.rank);
  }
  out.left_out_by.assign(static_cast<size_t>(world.size), 0);
  const RelaxedCounts counts = stats.counts();
  for (size_t p = 0; p < counts.left_out_by.size() && p < out.left_out_by.size(); ++p)
    out.left_out_by[p] = static_cast<int64_t>(counts.left_out_by[p]);
  out.loss = problem.loss(x.data());
  MPI_Barrier(MPI_COMM_WORLD);  // every rank's last rounds are done
  return out;
}

std::string join(const std::vector<int64_t>& v) {
  std::ostringstream s;
  for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
  return s.str();
}

void run_straggler_mode(const StragglerArgs& args) {
  BenchWorld world;
  world.transport = args.transport;
  Report report(world.rank == 0, args.json);
  std::vector<double> speeds = args.speeds;
  if (speeds.empty()) {
    speeds.assign(static_cast<size_t>(world.size), 1.0);
    speeds.back() = 3.0;
  }
  RELAXCC_ENFORCE(static_cast<int>(speeds.size()) == world.size, InvalidArgument,
                  "straggler: --speeds needs one factor per rank (", world.size, "), got ",
                  speeds.size());
  RELAXCC_ENFORCE(args.steps >= 1 && args.warmup >= 0 && args.dim >= 1, InvalidArgument,
                  "straggler: -n >= 1, -w >= 0 and --dim >= 1, got ", args.steps, ", ", args.warmup,
                  ", ", args.dim);
  for (double s : speeds)
    RELAXCC_ENFORCE(s >= 1, InvalidArgument, "straggler: speeds are slowdowns >= 1, got ", s);
  const double slowest = *std::max_element(speeds.begin(), speeds.end());
  const double my_speed = speeds[static_cast<size_t>(world.rank)];
  // Ranks slower than twice the fastest are the stragglers; the others must keep pace.
  const bool judged = my_speed < 2 || slowest < 2;
  CommunicatorPtr comm = create_communicator(world, world.transport, world.tunables);
  std::ostringstream sp;
  for (size_t i = 0; i < speeds.size(); ++i) sp << (i ? "," : "") << speeds[i];
  report.print(detail::concat("# relaxcc-bench straggler: ", world.size, " ranks, speeds ",
                              sp.str(), ", ", args.steps, " timed steps after ", args.warmup,
                              " (the slow from the first step), dim ", args.dim));
  char line[512];
  std::snprintf(line, sizeof line, "%-20s %8s %9s %9s %7s %9s %11s %-16s %-16s", "case", "comp_ms",
                "even/s", "slow/s", "kept", "loss_x", "deadline_ms", "left_out", "left_out_by");
  report.print(line);
  int tag = 20000;
  for (double compute_ms : args.compute_ms)
    for (const std::string& name : args.cases) {
      const Outcome even = run_case(args, world, comm, name, compute_ms, 1.0, tag += 500, false);
      const Outcome slow =
          run_case(args, world, comm, name, compute_ms, my_speed, tag += 500, true);
      const double even_rate = -world.max_over_ranks(-even.rate);
      const double kept = -world.max_over_ranks(judged ? -slow.rate * my_speed / even_rate : -1e9);
      double sums[2] = {judged ? even.loss : 0, judged ? slow.loss : 0}, total[2];
      MPI_Allreduce(sums, total, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      const double loss_x = total[1] / total[0];
      const double deadline = world.max_over_ranks(judged ? slow.deadline_ms : 0.0);
      std::vector<int64_t> left_out(static_cast<size_t>(world.size)),
          left_out_by(static_cast<size_t>(world.size));
      MPI_Allreduce(slow.left_out.data(), left_out.data(), world.size, MPI_INT64_T, MPI_SUM,
                    MPI_COMM_WORLD);
      // Per rank: the rounds its peers told it that it was left out.
      int64_t mine = 0;
      for (int64_t v : slow.left_out_by) mine += v;
      MPI_Allgather(&mine, 1, MPI_INT64_T, left_out_by.data(), 1, MPI_INT64_T, MPI_COMM_WORLD);
      std::snprintf(line, sizeof line, "%-20s %8.0f %9.2f %9.2f %7.3f %9.3f %11.2f %-16s %-16s",
                    name.c_str(), compute_ms, even_rate, kept * even_rate, kept, loss_x, deadline,
                    join(left_out).c_str(), join(left_out_by).c_str());
      report.print(line);
      report.add(Row()
                     .set("mode", "straggler")
                     .set("case", name)
                     .set("ranks", world.size)
                     .set("speeds", sp.str())
                     .set("compute_ms", compute_ms)
                     .set("steps", args.steps)
                     .set("warmup", args.warmup)
                     .set("dim", args.dim)
                     .set("rate_mbit", args.rate_mbit)
                     .set("even_steps_per_s", even_rate)
                     .set("kept", kept)
                     .set("loss_ratio", loss_x)
                     .set("deadline_ms", deadline)
                     .set("left_out", join(left_out))
                     .set("left_out_by", join(left_out_by)));
    }
}

}  // namespace

void add_straggler_mode(CLI::App& app) {
  auto args = std::make_shared<StragglerArgs>();
  CLI::App* sub = app.add_subcommand(
      "straggler",
      "Relaxations with a straggler slow from its first step: step rate kept, loss, learned "
      "deadline, peers left out");
  sub->add_option("--cases", args->cases, "Cases")->delimiter(',');
  sub->add_option("--compute-ms", args->compute_ms, "Compute per step (ms), one run each")
      ->delimiter(',');
  sub->add_option("--speeds", args->speeds,
                  "Slowdown per rank (default: the last rank 3x, the others 1)")
      ->delimiter(',');
  sub->add_option("-n,--steps", args->steps, "Timed steps (of a rank at speed 1)");
  sub->add_option("-w,--warmup", args->warmup, "Steps before the timed ones (counted alike)");
  sub->add_option("--dim", args->dim, "Parameters of the problem");
  sub->add_option("--lr", args->lr, "Learning rate");
  sub->add_option("--rate-mbit", args->rate_mbit, "Link rate recorded in the rows");
  sub->add_flag(
      "--per-rank", args->per_rank,
      "Print each rank's record of its peers in the slow run (arrivals, rounds left out)");
  sub->add_option("--json", args->json, "Append rows as JSON lines to this file");
  add_transport_option(sub, args->transport);
  sub->callback([args] { run_straggler_mode(*args); });
}

}  // namespace relaxcc::bench
