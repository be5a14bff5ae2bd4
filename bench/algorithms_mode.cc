// `relaxcc-bench algorithms`: every algorithm module on one synthetic model
// (ResNet-50's 161 tensors, 25.6M f32 parameters), each step a backward whose
// compute is emulated by sleeping (compute_ms spread over the layers in
// proportion to their size, gradients marked ready as their layer finishes),
// then the optimizer step (SGD, or the algorithm's own). Algorithms run one
// after the other in the same run; gradient_allreduce first, as the baseline
// of every ratio.
//
// Timing: warmup steps, a drain of the algorithm's work in flight, one
// MPI_Barrier, then the timed steps back to back with no barrier between
// them (ranks wait for each other only where the algorithm's communication
// makes them). Per algorithm: step_ms is each rank's time for all timed
// steps over their number (so a periodic algorithm's communicating steps
// count in proportion), the maximum over ranks; the median column is the
// median of each rank's own step durations, the maximum over ranks.
// bytes_per_step is what each rank's transport sent per timed step on the
// communicator the Reducer and its algorithm were given and on every
// communicator they made from it (groups of a round, hierarchy levels:
// TrafficCounter, traffic_counter.h), mean over ranks: payloads, headers
// and indices included, TCP/IP headers not; peak_bytes_per_step is the
// most any rank sent during one timed step (counted as the transport posts
// each message or segment). bytegrad runs flat here (with one rank per
// emulated host, the hierarchy would be the flat schedule anyway).
//
// Straggler (--straggler-rank R --straggler-factor F): every algorithm runs
// twice, first with every rank computing compute_ms per step, then with
// rank R computing F times as long; the rows report the step rate of the
// other ranks in both runs (timed steps over the slowest of them) and its
// ratio.
#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "model_layers.h"
#include "modes.h"
#include "relaxcc/algorithms/async_model_average.h"
#include "relaxcc/algorithms/bytegrad.h"
#include "relaxcc/algorithms/cocktail_sgd.h"
#include "relaxcc/algorithms/decentralized_sgd.h"
#include "relaxcc/algorithms/diloco.h"
#include "relaxcc/algorithms/gradient_allreduce.h"
#include "relaxcc/algorithms/local_sgd.h"
#include "relaxcc/algorithms/low_precision_decentralized_sgd.h"
#include "relaxcc/algorithms/moshpit_sgd.h"
#include "relaxcc/algorithms/qadam.h"
#include "relaxcc/errors.h"
#include "relaxcc/mpi_communicator.h"
#include "relaxcc/reducer.h"
#include "relaxcc/traffic_counter.h"
#include "report.h"

namespace relaxcc::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct AlgorithmsArgs {
  std::string transport = "mpi";
  std::string model = "resnet50";
  double model_scale = 1;  // every tensor's size times this (at least 1 element)
  std::vector<std::string> algorithms{
      "gradient_allreduce",  "bytegrad", "qadam", "cocktail_sgd", "cocktail_sgd:paper",
      "cocktail_sgd:sparse", "local_sgd"};
  double compute_ms = 200;
  double rate_mbit = 0;  // recorded in the rows (the harness's link rate; 0: unshaped)
  int iters = 8, warmup = 2;
  int straggler_rank = -1;  // < 0: no straggler runs
  double straggler_factor = 3;
  std::string gradients = "normal";  // the emulated gradients' distribution
  std::string json;
};

// The model: each layer a gradient and its parameter.
struct Model {
  std::vector<Layer> layers;
  std::vector<std::vector<float>> grads, params;
  std::vector<TensorSpec> specs;
  int64_t total = 0;

  Model(const std::string& name, double scale, int rank, bool normal) : layers(model_layers(name)) {
    for (Layer& l : layers)
      l.numel = std::max<int64_t>(1, std::llround(static_cast<double>(l.numel) * scale));
    for (size_t i = 0; i < layers.size(); ++i) {
      const auto n = static_cast<size_t>(layers[i].numel);
      grads.emplace_back(n);
      params.emplace_back(n, 0.01f);
      total += layers[i].numel;
    }
    for (size_t i = 0; i < layers.size(); ++i) {
      specs.push_back({layers[i].name + ".grad", TensorView::host(grads[i].data(), layers[i].numel),
                       TensorRole::gradient, static_cast<int>(2 * i + 1)});
      specs.push_back({layers[i].name, TensorView::host(params[i].data(), layers[i].numel),
                       TensorRole::parameter});
    }
    fill_gradients(rank, normal);
  }
  // Gradients of varied magnitude (a top-k has something to choose), a
  // different pattern per rank: normal with standard deviation 1e-3 (trained
  // networks' gradients are bell-shaped), or uniform on [-1e-3, 1e-3] (the
  // worst case for packed payloads: the most even codes). Written once: the
  // steps reuse them as the algorithms leave them (regenerating 25.6M values
  // costs about 0.3 s of CPU per step here, which the timed steps must not
  // carry).
  void fill_gradients(int rank, bool normal) {
    uint64_t h = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank * 1009 + 1);
    const auto next = [&h] {
      h ^= h << 13;
      h ^= h >> 7;
      h ^= h << 17;
      return h;
    };
    // A uniform in (0, 1) from the top 53 bits.
    const auto unit = [&next] { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; };
    for (auto& g : grads)
      for (float& v : g) {
        if (normal)  // Box-Muller, one of the pair
          v = static_cast<float>(1e-3 * std::sqrt(-2.0 * std::log(unit())) *
                                 std::cos(6.283185307179586 * unit()));
        else
          v = static_cast<float>(static_cast<int64_t>(next() % 2001) - 1000) * 1e-6f;
      }
  }
};

// One step: layer i (last first) is done once its share of compute_ms,
// in proportion to its size, has passed (sleeping), and its gradient is
// marked ready then; then the optimizer step.
void train_step(Reducer& reducer, const Model& model, double compute_ms, Optimizer& optimizer) {
  reducer.begin_step();
  const auto start = Clock::now();
  int64_t done = 0;  // parameters of the layers computed so far
  for (int i = static_cast<int>(model.layers.size()) - 1; i >= 0; --i) {
    done += model.layers[i].numel;
    const double fraction = static_cast<double>(done) / static_cast<double>(model.total);
    std::this_thread::sleep_until(
        start + std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double, std::milli>(compute_ms * fraction)));
    reducer.mark_ready(2 * i);
  }
  reducer.synchronize();
  reducer.optimizer_step(optimizer);
}

// The integer after `key` in `setting` ("-streaming10" -> 10), or `fallback`
// when `key` is followed by no digit; nullopt when `key` is absent.
std::optional<int> setting_number(const std::string& setting, const std::string& key,
                                  int fallback) {
  const size_t at = setting.find(key);
  if (at == std::string::npos) return std::nullopt;
  size_t end = at + key.size();
  while (end < setting.size() && std::isdigit(static_cast<unsigned char>(setting[end]))) ++end;
  if (end == at + key.size()) return fallback;
  return std::stoi(setting.substr(at + key.size(), end - at - key.size()));
}

// "name" or "name:setting". Modules with point-to-point rounds get `tag`
// as their tag base, so that runs one after the other on one communicator
// never share a tag's round sequence.
AlgorithmPtr make_algorithm(const std::string& spec, int tag, std::string* setting) {
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  *setting = colon == std::string::npos ? "defaults" : spec.substr(colon + 1);
  const bool defaults = *setting == "defaults";
  if (name == "gradient_allreduce" && defaults)
    return std::make_shared<algorithms::GradientAllreduce>();
  if (name == "bytegrad" && defaults) {
    algorithms::ByteGradOptions o;
    o.hierarchical = false;
    *setting = "8-bit, flat";
    return std::make_shared<algorithms::ByteGrad>(o);
  }
  if (name == "qadam" && defaults) {
    algorithms::QAdamOptions o;
    o.warmup_steps = 0;  // every timed step compressed
    *setting = "8-bit min-max, after warmup";
    return std::make_shared<algorithms::QAdam>(o);
  }
  if (name == "cocktail_sgd" && defaults) return std::make_shared<algorithms::CocktailSgd>();
  if (name == "cocktail_sgd" && *setting == "paper") {
    algorithms::CocktailSgdOptions o;
    o.random_ratio = 0.1;
    o.topk_ratio = 0.2;
    o.bits = 4;
    *setting = "paper: p 0.1, top-k 0.2, 4-bit";
    return std::make_shared<algorithms::CocktailSgd>(o);
  }
  // The sparsest setting that passes the convergence harness: no index
  // travels.
  if (name == "cocktail_sgd" && *setting == "sparse") {
    *setting = "sparse: p 0.2, top-k 1, 2b/2048";
    return std::make_shared<algorithms::CocktailSgd>(algorithms::CocktailSgdOptions::sparse());
  }
  // The same, every payload packed with zstd (the same trajectory).
  if (name == "cocktail_sgd" && *setting == "sparse-packed") {
    algorithms::CocktailSgdOptions o = algorithms::CocktailSgdOptions::sparse();
    o.pack_payloads = true;
    *setting = "sparse, packed: p 0.2, top-k 1, 2b/2048, zstd";
    return std::make_shared<algorithms::CocktailSgd>(o);
  }
  if (name == "local_sgd" && defaults) return std::make_shared<algorithms::LocalSgd>();
  // decentralized_sgd[:<mode>[-adaptive[-k<tenths>]|-deadline<ms>]]: a
  // gossip peer mode (all, ring, shift_one, exponential; defaults: all),
  // with an adaptive deadline (median + k MAD; -k10: k = 1.0, default 3) or
  // a fixed one (not with all).
  if (name == "decentralized_sgd") {
    algorithms::DecentralizedSgdOptions o;
    o.tag = tag;
    if (!defaults) {
      const std::string mode = setting->substr(0, setting->find('-'));
      o.mode = parse_gossip_mode(mode);
      o.deadline.adaptive = setting->find("-adaptive") != std::string::npos;
      if (const auto k = setting_number(*setting, "-k", 30))
        o.deadline.adaptive_options.k = *k / 10.0;
      if (const auto ms = setting_number(*setting, "-deadline", 0)) {
        RELAXCC_ENFORCE(*ms > 0, InvalidArgument,
                        "algorithms: decentralized_sgd's -deadline<ms> needs a number, got '",
                        *setting, "'");
        o.deadline.fixed = std::chrono::milliseconds(*ms);
      }
    }
    *setting = detail::concat(
        "mode ", gossip_mode_name(o.mode),
        o.deadline.adaptive
            ? detail::concat(", adaptive deadline",
                             o.deadline.adaptive_options.k != 3.0
                                 ? detail::concat(" k ", o.deadline.adaptive_options.k)
                                 : std::string())
        : o.deadline.fixed.count() > 0
            ? detail::concat(", deadline ", o.deadline.fixed.count() / 1000, " ms")
            : std::string());
    return std::make_shared<algorithms::DecentralizedSgd>(o);
  }
  if (name == "low_precision_decentralized_sgd" && defaults) {
    algorithms::LowPrecisionDecentralizedSgdOptions o;
    o.tag = tag;
    *setting = "ring, 8-bit min-max";
    return std::make_shared<algorithms::LowPrecisionDecentralizedSgd>(o);
  }
  // moshpit_sgd[:no-deadline|:k<tenths>]: the 2-axis grid with adaptive
  // deadlines (its defaults; k<tenths>: median + k MAD, k10: k = 1.0), or
  // without deadlines.
  if (name == "moshpit_sgd" &&
      (defaults || *setting == "no-deadline" || setting->rfind("k", 0) == 0)) {
    algorithms::MoshpitSgdOptions o;
    o.tag = tag;
    if (*setting == "no-deadline") o.deadline = algorithms::RoundDeadlineOptions{};
    if (const auto k = setting_number(*setting, "k", 30)) o.deadline.adaptive_options.k = *k / 10.0;
    *setting = *setting == "no-deadline"
                   ? "grid, no deadline"
                   : detail::concat("grid, adaptive deadline",
                                    o.deadline.adaptive_options.k != 3.0
                                        ? detail::concat(" k ", o.deadline.adaptive_options.k)
                                        : std::string());
    return std::make_shared<algorithms::MoshpitSgd>(o);
  }
  if (name == "async_model_average" && defaults) {
    algorithms::AsyncModelAverageOptions o;
    o.tag = tag;
    return std::make_shared<algorithms::AsyncModelAverage>(o);
  }
  // diloco:h<H>[-4bit|-sparseloco][-streaming[<F>]][-eager]: H inner steps
  // (defaults: 500), 4-bit min-max pseudo-gradients with error feedback or
  // SparseLoCo's recipe (chunk-wise top-2 of 64, 2-bit values, decayed error
  // feedback, outer SGD lr 1), F streaming fragments of whole buckets (4 when
  // F is left out), one-round-delayed outer steps.
  if (name == "diloco") {
    algorithms::DilocoOptions o;
    bool sparseloco = false;
    if (!defaults) {
      RELAXCC_ENFORCE(setting->size() > 1 && (*setting)[0] == 'h', InvalidArgument,
                      "algorithms: diloco's setting is "
                      "h<H>[-4bit|-sparseloco][-streaming[<F>]][-eager], got '",
                      *setting, "'");
      const int h = std::stoi(setting->substr(1));
      sparseloco = setting->find("-sparseloco") != std::string::npos;
      if (sparseloco) o = algorithms::sparseloco_options(h);
      o.inner_steps = h;
      if (setting->find("-4bit") != std::string::npos) {
        o.codec = kernels::CompressorConfig{};
        o.codec->bits = 4;
      }
      o.fragments = setting_number(*setting, "-streaming", 4).value_or(1);
      o.eager = setting->find("-eager") != std::string::npos;
    }
    *setting = detail::concat(
        "H ", o.inner_steps, o.codec ? ", 4-bit" : "",
        sparseloco ? ", SparseLoCo (chunk top-2/64, 2-bit)" : "",
        o.fragments > 1 ? detail::concat(", ", o.fragments, " fragments") : std::string(),
        o.eager ? ", eager" : "");
    return std::make_shared<algorithms::Diloco>(o);
  }
  RELAXCC_THROW(InvalidArgument, "algorithms: unknown algorithm '", spec,
                "' (gradient_allreduce, bytegrad, qadam, cocktail_sgd, "
                "cocktail_sgd:paper|sparse|sparse-packed, local_sgd, "
                "decentralized_sgd[:<mode>[-adaptive[-k<tenths>]|-deadline<ms>]], "
                "low_precision_decentralized_sgd, moshpit_sgd[:no-deadline|:k<tenths>], "
                "async_model_average, "
                "diloco, diloco:h<H>[-4bit|-sparseloco][-streaming[<F>]][-eager])");
}

// One algorithm's timed run, aggregated over ranks (every rank holds it).
struct Pass {
  std::string name, setting;
  double step_ms = 0;         // time for the timed steps / steps, max over ranks
  double median_ms = 0;       // median step duration, max over ranks
  double bytes = 0;           // bytes sent per rank and timed step
  double peak_bytes = 0;      // most bytes sent by one rank in one timed step
  double peak_mbit = 0;       // that step's bytes over its duration, max over ranks and steps
  double others_step_ms = 0;  // step_ms over the ranks other than the straggler
  double straggler_step_ms = 0;
  int64_t left_out = 0;  // peers left out of rounds by a deadline, summed over ranks
};

// Streaming DiLoCo's fragments are whole buckets: a bucket cap of an
// eighth of a fragment's share of the model (at most the default 25 MiB)
// leaves about 8 buckets per fragment.
int64_t diloco_bucket_cap(const Model& model, const std::string& spec) {
  const int64_t cap = int64_t{25} << 20;
  if (spec.find("-streaming") == std::string::npos) return cap;
  const int fragments =
      setting_number(spec.substr(spec.find(':') + 1), "-streaming", 4).value_or(1);
  int64_t bytes = 0;
  for (const TensorSpec& t : model.specs)
    if (t.role == TensorRole::gradient) bytes += t.view.nbytes();
  return std::clamp<int64_t>(bytes / (8 * int64_t{fragments}), int64_t{1} << 16, cap);
}

Pass run_pass(BenchWorld& world, const CommunicatorPtr& comm, Model& model,
              const AlgorithmsArgs& args, const std::string& spec, int tag, bool straggle) {
  Pass pass;
  AlgorithmPtr algorithm = make_algorithm(spec, tag, &pass.setting);
  pass.name = algorithm->name();
  const bool straggler = straggle && world.rank == args.straggler_rank;
  const double compute_ms = args.compute_ms * (straggler ? args.straggler_factor : 1.0);
  std::vector<double> times;
  uint64_t sent = 0;
  double total_ms = 0, peak_bytes = 0, peak_mbit = 0;
  {
    ReducerOptions ro;
    if (dynamic_cast<const algorithms::Diloco*>(algorithm.get()) != nullptr)
      ro.plan.cap_bytes = diloco_bucket_cap(model, spec);
    // comm's traffic and that of the communicators made from it (a
    // group_average round's group, a hierarchy's levels, the Reducer's own).
    const auto counted = std::make_shared<TrafficCounter>(comm);
    Reducer reducer(counted, model.specs, algorithm, ExecContext::host(), ro);
    Sgd sgd(SgdOptions{1e-3f});
    for (int i = 0; i < args.warmup; ++i) train_step(reducer, model, compute_ms, sgd);
    algorithm->drain(std::chrono::minutes(5));
    MPI_Barrier(MPI_COMM_WORLD);
    const uint64_t sent0 = counted->bytes_sent();
    uint64_t before = sent0;
    const auto start = Clock::now();
    for (int i = 0; i < args.iters; ++i) {
      const auto t0 = Clock::now();
      train_step(reducer, model, compute_ms, sgd);
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      times.push_back(ms);
      const uint64_t after = counted->bytes_sent();
      const double step_bytes = static_cast<double>(after - before);
      before = after;
      peak_bytes = std::max(peak_bytes, step_bytes);
      peak_mbit = std::max(peak_mbit, step_bytes * 8 / (ms * 1e3));
    }
    total_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    algorithm->shutdown(std::chrono::minutes(5));
    sent = counted->bytes_sent() - sent0;
    if (auto* rounds = dynamic_cast<algorithms::WeightRounds*>(algorithm.get()))
      pass.left_out = rounds->missing_peers();
  }
  const double mean_ms = total_ms / args.iters;
  pass.step_ms = world.max_over_ranks(mean_ms);
  pass.median_ms = world.max_over_ranks(median(times));
  pass.bytes = static_cast<double>(world.sum_over_ranks(static_cast<int64_t>(sent))) / world.size /
               args.iters;
  pass.peak_bytes = world.max_over_ranks(peak_bytes);
  pass.peak_mbit = world.max_over_ranks(peak_mbit);
  const bool is_straggler_rank = world.rank == args.straggler_rank;
  pass.others_step_ms = world.max_over_ranks(is_straggler_rank ? 0.0 : mean_ms);
  pass.straggler_step_ms = world.max_over_ranks(is_straggler_rank ? mean_ms : 0.0);
  pass.left_out = world.sum_over_ranks(pass.left_out);
  return pass;
}

Row common_row(const Pass& p, const AlgorithmsArgs& args, const Model& model, int ranks) {
  return Row()
      .set("mode", "algorithms")
      .set("algorithm", p.name)
      .set("setting", p.setting)
      .set("model", args.model)
      .set("model_scale", args.model_scale)
      .set("params", model.total)
      .set("gradients", args.gradients)
      .set("ranks", ranks)
      .set("bytes_per_step", p.bytes)
      .set("peak_bytes_per_step", p.peak_bytes)
      .set("peak_step_mbit", p.peak_mbit)
      .set("step_ms", p.step_ms)
      .set("step_ms_median", p.median_ms);
}

void run_algorithms(const AlgorithmsArgs& args) {
  BenchWorld world;
  world.transport = args.transport;
  Report report(world.rank == 0, args.json);
  RELAXCC_ENFORCE(args.iters >= 1 && args.warmup >= 0, InvalidArgument,
                  "algorithms: -n must be >= 1 and -w >= 0, got ", args.iters, " and ",
                  args.warmup);
  const bool straggling = args.straggler_rank >= 0;
  RELAXCC_ENFORCE(!straggling || (args.straggler_rank < world.size && args.straggler_factor > 0),
                  InvalidArgument, "algorithms: --straggler-rank must be below the ", world.size,
                  " ranks and --straggler-factor > 0, got ", args.straggler_rank, " and ",
                  args.straggler_factor);
  CommunicatorPtr comm = create_communicator(world, world.transport, world.tunables);
  RELAXCC_ENFORCE(args.model_scale > 0 && args.model_scale <= 1, InvalidArgument,
                  "algorithms: --model-scale must be in (0, 1], got ", args.model_scale);
  RELAXCC_ENFORCE(args.gradients == "normal" || args.gradients == "uniform", InvalidArgument,
                  "algorithms: --gradients must be normal or uniform, got '", args.gradients, "'");
  Model model(args.model, args.model_scale, world.rank, args.gradients == "normal");
  report.print(detail::concat(
      "# relaxcc-bench algorithms: ", world.size, " ranks, ", args.model,
      args.model_scale != 1 ? detail::concat(" scaled by ", args.model_scale) : std::string(), " (",
      model.total, " f32 parameters), compute ", args.compute_ms, " ms per step (sleep), link ",
      args.rate_mbit > 0 ? std::to_string(args.rate_mbit) + " Mbit/s" : std::string("unshaped"),
      ", ", args.iters, " timed steps after ", args.warmup,
      "; step time: timed steps back to back, max over ranks; bytes sent per rank and step",
      straggling ? detail::concat("; straggler: rank ", args.straggler_rank, " computes ",
                                  args.straggler_factor, "x")
                 : std::string()));
  char line[512];
  if (straggling) {
    std::snprintf(line, sizeof line, "%-32s %-36s %10s %10s %10s %10s %9s %9s", "algorithm",
                  "setting", "even(ms)", "strag(ms)", "rate_x", "slow(ms)", "left_even",
                  "left_out");
  } else {
    std::snprintf(line, sizeof line, "%-20s %-32s %12s %10s %12s %10s %10s %10s", "algorithm",
                  "setting", "bytes/step", "bytes_x", "peak/step", "step(ms)", "step_x", "median");
  }
  report.print(line);
  double base_bytes = 0, base_ms = 0;
  int tag = 40000;  // each run its own tags (the modules use fewer than 1000)
  for (const std::string& spec : args.algorithms) {
    const Pass even = run_pass(world, comm, model, args, spec, tag += 1000, false);
    if (straggling) {
      const Pass slow = run_pass(world, comm, model, args, spec, tag += 1000, true);
      // Step rates of the ranks other than the straggler, and their ratio.
      const double rate_even = 1e3 / even.others_step_ms;
      const double rate_slow = 1e3 / slow.others_step_ms;
      std::snprintf(line, sizeof line, "%-32s %-36s %10.1f %10.1f %10.3f %10.1f %9lld %9lld",
                    even.name.c_str(), even.setting.c_str(), even.others_step_ms,
                    slow.others_step_ms, rate_slow / rate_even, slow.straggler_step_ms,
                    static_cast<long long>(even.left_out), static_cast<long long>(slow.left_out));
      report.print(line);
      report.add(common_row(even, args, model, world.size)
                     .set("straggler_rank", args.straggler_rank)
                     .set("straggler_factor", args.straggler_factor)
                     .set("step_ms_others", even.others_step_ms)
                     .set("step_ms_others_straggler", slow.others_step_ms)
                     .set("step_ms_straggler_rank", slow.straggler_step_ms)
                     .set("step_rate_others", rate_even)
                     .set("step_rate_others_straggler", rate_slow)
                     .set("step_rate_ratio", rate_slow / rate_even)
                     .set("peers_left_out", even.left_out)
                     .set("peers_left_out_straggler", slow.left_out)
                     .set("compute_ms", args.compute_ms)
                     .set("rate_mbit", args.rate_mbit)
                     .set("iters", args.iters)
                     .set("warmup", args.warmup));
      continue;
    }
    if (even.name == "gradient_allreduce" && base_bytes == 0) {
      base_bytes = even.bytes;
      base_ms = even.step_ms;
    }
    const double bytes_ratio = base_bytes > 0 && even.bytes > 0 ? base_bytes / even.bytes : 0;
    const double step_ratio = base_ms > 0 ? even.step_ms / base_ms : 0;
    std::snprintf(line, sizeof line, "%-20s %-32s %12.0f %10.2f %12.0f %10.1f %10.3f %10.1f",
                  even.name.c_str(), even.setting.c_str(), even.bytes, bytes_ratio, even.peak_bytes,
                  even.step_ms, step_ratio, even.median_ms);
    report.print(line);
    report.add(common_row(even, args, model, world.size)
                   .set("bytes_ratio_vs_allreduce", bytes_ratio)
                   .set("step_ratio_vs_allreduce", step_ratio)
                   .set("step_x_compute", even.step_ms / args.compute_ms)
                   .set("peers_left_out", even.left_out)
                   .set("compute_ms", args.compute_ms)
                   .set("rate_mbit", args.rate_mbit)
                   .set("iters", args.iters)
                   .set("warmup", args.warmup));
  }
}

}  // namespace

void add_algorithms_mode(CLI::App& app) {
  auto args = std::make_shared<AlgorithmsArgs>();
  CLI::App* sub = app.add_subcommand(
      "algorithms", "Bytes and time per step of every algorithm module on a synthetic model");
  sub->add_option("--model", args->model, "resnet50 or bert-base")->capture_default_str();
  sub->add_option("--model-scale", args->model_scale,
                  "Every tensor's size times this, in (0, 1] (at least 1 element): the model's "
                  "tensor structure with less data per step")
      ->capture_default_str();
  sub->add_option("--algorithms", args->algorithms,
                  "Algorithms in order (name or name:setting); bytes_x and step_x are against the "
                  "first gradient_allreduce")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--compute-ms", args->compute_ms, "Emulated backward compute per step (sleep)")
      ->capture_default_str();
  sub->add_option("--rate-mbit", args->rate_mbit,
                  "Link rate recorded in the JSON rows (relaxcc-hosts --rate; 0: unshaped)")
      ->capture_default_str();
  sub->add_option("-n,--iters", args->iters, "Timed steps")->capture_default_str();
  sub->add_option("-w,--warmup_iters", args->warmup, "Untimed steps first")->capture_default_str();
  sub->add_option("--straggler-rank", args->straggler_rank,
                  "Run every algorithm without and then with this rank computing "
                  "--straggler-factor times as long, and report the other ranks' step rates "
                  "(< 0: no straggler runs)")
      ->capture_default_str();
  sub->add_option("--straggler-factor", args->straggler_factor,
                  "The straggler's compute time over the others'")
      ->capture_default_str();
  sub->add_option("--gradients", args->gradients,
                  "The emulated gradients' distribution: normal or uniform (what packed payloads "
                  "save depends on it)")
      ->capture_default_str();
  sub->add_option("--json", args->json, "Append JSON Lines rows to this file");
  add_transport_option(sub, args->transport);
  sub->callback([args] { run_algorithms(*args); });
}

}  // namespace relaxcc::bench
