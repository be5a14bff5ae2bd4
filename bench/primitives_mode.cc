// `relaxcc-bench primitives`: the relaxed primitives side by side with
// MPI_Allreduce of the same data, in the same run.
//
// For each primitive, every round starts from fresh per-rank data (normal,
// mean = rank) and reports the median time per round, the bytes this rank
// sent per round (RelaxedStats) and the distance to the global average after
// the round: ||x_r - mean|| / ||mean||, the largest over ranks. Primitives:
// gossip in every mode, CHOCO (ring, 8-bit min-max), Moshpit group
// averaging (a 2-D grid when the rank count is a square, else one group per
// pair), and asynchronous averaging (mode all, interval 1: the time of a
// step() call, with the averaging running behind it). Async rounds get
// fresh data too: each step() applies the average that came (x += avg -
// snapshot) and snapshots x for the next, and after the last, stop()
// applies the last average, leaving x = avg(S) for the last snapshot S;
// S's mean is the last inputs' mean (the earlier averages cancel in it), so
// its distance and rel_error are those of the last average, as for the
// others (a last average that did not come within stop() fails the run).
//
// --shares equal,balanced --rates R0,R1,...: each primitive that splits x
// into owned shards (allreduce: the relaxcc ring; compressed_*, auto and
// topk: the owner schedule) runs once per share setting, in the same run:
// equal shards, then shares from the link rates (ring_shares or
// owner_shares, relaxcc/collectives/shares.h); a balanced row also reports
// its time over the equal row's.
//
// --straggler R --slowdown S: a training-like loop of --compute-ms per round
// (rank R: S times as long) of group averaging over all ranks, run three
// ways: nobody slow (adaptive deadline), R slow without a deadline, R slow
// with an adaptive deadline. Every round averages fresh data (rank + a
// uniform in [-1, 1), from a hash of rank, round and element, written
// during the round's compute). It reports the rounds per second of the
// other ranks and its ratio to the straggler-free rate, and checks every
// round's result on every rank against the average over the ranks that
// arrived there (Work::contributors() with a deadline; every rank without),
// at up to 4096 sampled elements: |x - avg| / mean|inputs| must stay within
// its stated error, one f32 rounding (2^-24) with a deadline (the exchange
// averages in double), n roundings without (the allreduce sums in f32). It
// reports the worst per run, and fails (InternalError) when one is
// exceeded.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "modes.h"
#include "relaxcc/collectives/shares.h"
#include "relaxcc/errors.h"
#include "relaxcc/mpi_communicator.h"
#include "relaxcc/relaxed/async_average.h"
#include "relaxcc/relaxed/auto_codec.h"
#include "relaxcc/relaxed/choco_gossip.h"
#include "relaxcc/relaxed/compressed_allreduce.h"
#include "relaxcc/relaxed/gossip.h"
#include "relaxcc/relaxed/group_average.h"
#include "relaxcc/relaxed/sparse_allreduce.h"
#include "relaxcc/tunables.h"
#include "report.h"

namespace relaxcc::bench {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct PrimitivesArgs {
  std::string transport = "mpi";
  std::string bytes = "4M";
  int iters = 10, warmup = 2;
  std::vector<std::string> primitives{"mpi",         "all",   "ring",    "shift_one",
                                      "exponential", "choco", "moshpit", "async"};
  int straggler = -1;
  double slowdown = 3.0;
  double compute_ms = 20.0;
  int straggler_rounds = 30;
  double rate_mbit = 0;                      // recorded in the JSON rows (the harness's link rate)
  std::string segment_bytes;                 // compressed allreduce segments; empty: the default
  std::vector<std::string> shares{"equal"};  // equal, balanced: one run each
  std::vector<double> rates;                 // per rank, for balanced shares
  std::string json;
};

double elapsed_us(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

void fresh_data(std::vector<float>& x, int rank, int round) {
  std::mt19937 rng(static_cast<unsigned>(rank * 7919 + round));
  std::normal_distribution<float> normal(static_cast<float>(rank), 1.0f);
  for (float& v : x) v = normal(rng);
}

// The exact average over ranks of x, in double.
std::vector<double> exact_mean(const std::vector<float>& x, const BenchWorld& world) {
  std::vector<double> mean(x.begin(), x.end());
  MPI_Allreduce(MPI_IN_PLACE, mean.data(), static_cast<int>(mean.size()), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
  for (double& m : mean) m /= world.size;
  return mean;
}

// max over ranks of ||x_r - reference|| / ||reference||.
double relative_distance(const std::vector<float>& x, const std::vector<double>& reference,
                         const BenchWorld& world) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff += (x[i] - reference[i]) * (x[i] - reference[i]);
    norm += reference[i] * reference[i];
  }
  return world.max_over_ranks(std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30));
}

std::vector<int> moshpit_grid(int n) {
  const int m = static_cast<int>(std::lround(std::sqrt(n)));
  if (m * m == n) return {m, m};
  return {2, (n + 1) / 2};
}

// One round of `name` on x; `round` from 1.
struct Primitive {
  std::function<void(std::vector<float>& x, uint64_t round)> run;
  RelaxedStats stats;
};

void run_rows(const PrimitivesArgs& args, BenchWorld& world, Report& report) {
  const int64_t count = std::max<int64_t>(parse_size(args.bytes) / 4, 1);
  CommunicatorPtr comm = relaxcc_communicator(world);
  const ExecContext& host = ExecContext::host();
  CompressedAllreduceOptions compressed_options;
  if (!args.segment_bytes.empty())
    compressed_options.segment_bytes = parse_size(args.segment_bytes);
  report.print(
      "#   primitive      size   time(us)  sent/rank/round  distance  rel_error  vs MPI_Allreduce");
  double mpi_us = 0;
  uint64_t tag_round = 0;  // rounds increase across primitives (shared tags are per primitive)
  const auto sharded = [](const std::string& name) {
    return name == "allreduce" || name == "auto" || name.rfind("compressed_", 0) == 0 ||
           name.rfind("topk", 0) == 0;
  };
  std::vector<std::pair<std::string, std::string>> runs;  // (primitive, shares)
  for (const std::string& name : args.primitives)
    for (const std::string& kind : args.shares) {
      RELAXCC_ENFORCE(kind == "equal" || kind == "balanced", InvalidArgument,
                      "primitives --shares: ", kind, " (expected equal or balanced)");
      if (kind == "equal" || sharded(name)) runs.emplace_back(name, kind);
    }
  const bool balanced_runs =
      std::find(args.shares.begin(), args.shares.end(), "balanced") != args.shares.end();
  RELAXCC_ENFORCE(!balanced_runs || static_cast<int>(args.rates.size()) == world.size,
                  InvalidArgument, "primitives --shares balanced: ", args.rates.size(),
                  " --rates for ", world.size, " ranks (expected one per rank)");
  std::map<std::string, double> equal_us;  // per primitive
  for (const auto& [name, kind] : runs) {
    const bool balanced = kind == "balanced";
    // Identical on every rank: computed from the same --rates.
    const std::vector<double> ring_split =
        balanced ? ring_shares(args.rates) : std::vector<double>{};
    const std::vector<double> owner_split =
        balanced ? owner_shares(args.rates) : std::vector<double>{};
    const std::string shown = balanced ? name + "+bal" : name;
    Primitive p;
    std::string codec_name = "f32";
    int codec_bits = 32;
    std::unique_ptr<ChocoGossip> choco;
    std::unique_ptr<AutoCodec> chooser;
    std::unique_ptr<AsyncModelAverager> averager;
    std::mutex lock;
    std::vector<float> x(static_cast<size_t>(count));
    if (name == "mpi") {
      p.run = [&](std::vector<float>& v, uint64_t) {
        MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                      MPI_COMM_WORLD);
        for (float& e : v) e /= static_cast<float>(world.size);
      };
    } else if (name == "allreduce") {
      // The relaxcc ring allreduce (sum, then divided as the MPI row).
      p.run = [&](std::vector<float>& v, uint64_t) {
        AllreduceOptions o;
        o.algo = AllreduceAlgo::ring;
        o.shares = ring_split;
        const TensorView t = TensorView::host(v.data(), count);
        comm->allreduce(t, t, host, o)->wait();
        for (float& e : v) e /= static_cast<float>(world.size);
      };
    } else if (name == "mpi_pairs") {
      // shift_one's exchange in plain MPI (MPI_Sendrecv with the round's
      // partner, then the average): what the traffic pattern itself costs.
      p.run = [&](std::vector<float>& v, uint64_t round) {
        const GossipPeers peers =
            gossip_peers(GossipMode::shift_one, world.rank, world.size, round);
        if (peers.send_to.empty()) return;
        std::vector<float> theirs(v.size());
        MPI_Sendrecv(v.data(), static_cast<int>(count), MPI_FLOAT, peers.send_to[0], 0,
                     theirs.data(), static_cast<int>(count), MPI_FLOAT, peers.recv_from[0], 0,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (size_t i = 0; i < v.size(); ++i) v[i] = 0.5f * (v[i] + theirs[i]);
        p.stats.add_round(peers.send_to, count * 4, peers.recv_from, count * 4);
      };
    } else if (name.rfind("compressed_", 0) == 0) {
      // compressed_8bit, _4bit, _2bit, _1bit (minmax), compressed_f16, _bf16,
      // compressed_f32 (the same schedule, f32 on the wire)
      const std::string codec = name.substr(11);
      std::optional<kernels::CompressorConfig> c = kernels::CompressorConfig{};
      if (codec == "f32") {
        c.reset();
      } else if (codec == "f16" || codec == "bf16") {
        c->kind = codec == "f16" ? kernels::CompressorKind::f16 : kernels::CompressorKind::bf16;
      } else {
        c->kind = kernels::CompressorKind::minmax;
        c->bits = std::stoi(codec);
      }
      if (c) {
        codec_name = kernels::compressor_name(c->kind);
        codec_bits = c->kind == kernels::CompressorKind::minmax ? c->bits : 16;
      }
      p.run = [&, c](std::vector<float>& v, uint64_t) {
        CompressedAllreduceOptions o = compressed_options;
        o.codec = c;
        o.shares = owner_split;
        o.op = ReduceOp::avg;
        o.stats = &p.stats;
        compressed_allreduce(*comm, TensorView::host(v.data(), count), host, o)->wait();
      };
    } else if (name == "auto") {
      // The auto codec, calibrated here (untimed), RELAXCC_AUTO_CODEC
      // forcing it if set.
      AutoCodecOptions ao;
      ao.force = Tunables::from_env().auto_codec;
      chooser = std::make_unique<AutoCodec>(AutoCodec::calibrate(*comm, host, ao));
      const AutoChoice choice = chooser->choose(count);
      if (choice.codec) {
        codec_name = kernels::compressor_name(choice.codec->kind);
        codec_bits =
            choice.codec->kind == kernels::CompressorKind::minmax ? choice.codec->bits : 16;
      }
      const AutoCodecMeasurements& m = chooser->measurements();
      std::string line =
          detail::concat("# auto: ring ", 1e-9 / std::max(m.ring_seconds_per_byte, 1e-30),
                         " GB/s, call ", m.call_seconds * 1e6, " us");
      for (size_t i = 0; i < ao.codecs.size(); ++i)
        line +=
            detail::concat("; ", relaxcc::codec_name(ao.codecs[i]), " encode ",
                           1e-9 / std::max(m.encode_seconds_per_byte[i], 1e-30), " GB/s, decode ",
                           1e-9 / std::max(m.decode_seconds_per_byte[i], 1e-30),
                           " GB/s, predicted ", chooser->predict(count, static_cast<int>(i)), " s");
      report.print(detail::concat(line, "; f32 predicted ", chooser->predict(count, -1),
                                  " s; chose ",
                                  choice.codec ? relaxcc::codec_name(*choice.codec) : "f32"));
      p.run = [&](std::vector<float>& v, uint64_t) {
        CompressedAllreduceOptions o = compressed_options;
        o.auto_codec = chooser.get();
        o.shares = owner_split;
        o.op = ReduceOp::avg;
        o.stats = &p.stats;
        compressed_allreduce(*comm, TensorView::host(v.data(), count), host, o)->wait();
      };
    } else if (name == "topk" || name.rfind("topk_", 0) == 0) {
      // Top-k sparse allreduce, averaged: topk keeps 1%, topk_<ratio> that
      // fraction (relaxcc/relaxed/sparse_allreduce.h).
      kernels::CompressorConfig c;
      c.kind = kernels::CompressorKind::topk;
      c.ratio = name == "topk" ? 0.01 : std::stod(name.substr(5));
      codec_name = kernels::compressor_name(c.kind);
      p.run = [&, c](std::vector<float>& v, uint64_t) {
        SparseAllreduceOptions o;
        o.codec = c;
        o.shares = owner_split;
        o.op = ReduceOp::avg;
        o.stats = &p.stats;
        sparse_allreduce(*comm, TensorView::host(v.data(), count), host, o)->wait();
      };
    } else if (name == "choco") {
      ChocoOptions o;
      o.stats = &p.stats;
      choco = std::make_unique<ChocoGossip>(comm, count, o);
      p.run = [&](std::vector<float>& v, uint64_t round) {
        choco->step(TensorView::host(v.data(), count), round, host)->wait();
      };
    } else if (name == "moshpit") {
      p.run = [&](std::vector<float>& v, uint64_t round) {
        GroupAverageOptions o;
        o.grid = moshpit_grid(world.size);
        o.round = round;
        o.stats = &p.stats;
        group_average(*comm, TensorView::host(v.data(), count), host, o)->wait();
      };
    } else if (name == "async") {
      AsyncAverageOptions o;
      o.stats = &p.stats;
      averager =
          std::make_unique<AsyncModelAverager>(comm, TensorView::host(x.data(), count), lock, o);
      p.run = [&](std::vector<float>&, uint64_t) { averager->step(); };
    } else {
      const GossipMode mode = parse_gossip_mode(name);
      p.run = [&, mode](std::vector<float>& v, uint64_t round) {
        GossipOptions o;
        o.mode = mode;
        o.round = round;
        o.stats = &p.stats;
        gossip(*comm, TensorView::host(v.data(), count), host, o)->wait();
      };
    }
    std::vector<double> times;
    // The exact average of the last round's inputs.
    std::vector<double> exact;
    for (int it = 0; it < args.warmup + args.iters; ++it) {
      {
        std::lock_guard<std::mutex> hold(lock);  // async: the parameters' lock
        fresh_data(x, world.rank, it);
      }
      if (it + 1 == args.warmup + args.iters) exact = exact_mean(x, world);
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = Clock::now();
      p.run(x, ++tag_round);
      const double us = world.max_over_ranks(elapsed_us(t0));
      if (it >= args.warmup) times.push_back(us);
    }
    if (averager) {
      // The last average, applied: x = avg(S) for the last snapshot S.
      const int missed = averager->stop() ? 0 : 1;
      int any = 0;
      MPI_Allreduce(&missed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      RELAXCC_ENFORCE(any == 0, Timeout, "primitives async on rank ", world.rank,
                      ": expected the last average applied by stop(), but ",
                      missed ? "this rank's" : "another rank's",
                      " did not come within its stop_timeout");
    }
    const double distance = relative_distance(x, exact_mean(x, world), world);
    const double rel_error = exact.empty() ? 0.0 : relative_distance(x, exact, world);
    const double us = median(times);
    if (name == "mpi") mpi_us = us;
    if (!balanced) equal_us[name] = us;
    const double vs_equal = balanced && equal_us.count(name) ? us / equal_us[name] : 0.0;
    const RelaxedCounts c = p.stats.counts();
    double sent = name == "mpi" ? 2.0 * (world.size - 1) / world.size * count * 4
                                : (c.rounds ? static_cast<double>(c.bytes_sent) / c.rounds : 0.0);
    if (name == "allreduce") {
      // The ring sends the right neighbour every chunk but its own and the
      // neighbour's, once each way round.
      const std::vector<int64_t> chunk = shard_counts(count, world.size, ring_split);
      sent = 4.0 * static_cast<double>(2 * count - chunk[world.rank] -
                                       chunk[(world.rank + 1) % world.size]);
    }
    const double f32_ring = 2.0 * (world.size - 1) / world.size * count * 4;
    if (name == "async")
      report.print(
          "# async: time of a step() call; distance and rel_error after stop() applied the last "
          "average (x = avg(S), S the last snapshot, whose mean is the last inputs')");
    char line[256];
    std::snprintf(line, sizeof line, "%13s %9s %10.1f %16.0f %9.2e %10.2e %16.2f", shown.c_str(),
                  format_bytes(count * 4).c_str(), us, sent, distance, rel_error,
                  mpi_us > 0 ? us / mpi_us : 0.0);
    report.print(vs_equal > 0 ? detail::concat(line, "  vs equal ", vs_equal) : std::string(line));
    report.add(
        Row()
            .set("mode", "primitives")
            .set("primitive", name)
            .set("shares", kind)
            .set("time_vs_equal", vs_equal)
            .set("codec", codec_name)
            .set("bits", codec_bits)
            .set("ranks", world.size)
            .set("bytes", count * 4)
            .set("time_us", us)
            .set("sent_per_rank_per_round", sent)
            .set("bytes_on_wire", sent)
            .set("compression_ratio", codec_name == "f32" || sent <= 0 ? 1.0 : f32_ring / sent)
            .set("rel_error", rel_error)
            .set("rate_mbit", args.rate_mbit)
            .set("distance_to_mean", distance)
            .set("time_vs_mpi_allreduce", mpi_us > 0 ? us / mpi_us : 0.0));
  }
}

// Element i of `rank`'s input in round `round` of the straggler run: rank
// plus a uniform in [-1, 1), from a hash, so that any rank recomputes any
// other's element without generating its whole tensor.
float straggler_value(int rank, uint64_t round, int64_t i) {
  uint64_t z = round * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(rank) * 0xC2B2AE3D27D4EB4Full ^
               static_cast<uint64_t>(i);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(rank + static_cast<double>(z >> 40) * 0x1p-23 - 1.0);
}

struct StragglerRun {
  double rate = 0;   // rounds per second of the slowest rank but the straggler
  double worst = 0;  // the largest |x - avg| / mean|inputs| over rounds, ranks, samples
  double bound = 0;  // its stated error
  uint64_t worst_round = 0;
  int worst_rank = -1;
};

// Rounds per second of the ranks other than the straggler, and the worst
// error of a round's result against the average over the ranks that arrived.
StragglerRun straggler_rate(const PrimitivesArgs& args, BenchWorld& world, CommunicatorPtr comm,
                            bool slow, bool deadline, uint64_t& round, int tag) {
  const int64_t count = std::max<int64_t>(parse_size(args.bytes) / 4, 1);
  const int64_t samples = std::min<int64_t>(count, 4096), stride = count / samples;
  std::vector<float> x(static_cast<size_t>(count));
  AdaptiveDeadline adaptive;
  const auto compute =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(
          args.compute_ms * (slow && world.rank == args.straggler ? args.slowdown : 1.0)));
  // One f32 rounding of a double average (the exchange), or the f32 sums of
  // the allreduce's n inputs and its division (n roundings), in units of the
  // inputs' mean magnitude; 1.001: the second-order terms.
  const double u = 0x1p-24;
  StragglerRun run;
  run.bound = 1.001 * u * (deadline ? 1.0 : static_cast<double>(world.size));
  double worst = 0;
  uint64_t worst_round = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  for (int r = 0; r < args.straggler_rounds; ++r) {
    const auto start = Clock::now();
    GroupAverageOptions o;
    o.random_groups = 1;  // everyone, by exchange: the deadline path when deadline is on
    o.round = ++round;
    o.tag = tag;
    if (deadline) o.adaptive = &adaptive;
    // The round's fresh data is written during its compute.
    for (int64_t i = 0; i < count; ++i) x[i] = straggler_value(world.rank, o.round, i);
    std::this_thread::sleep_until(start + compute);
    WorkPtr w = group_average(*comm, TensorView::host(x.data(), count), ExecContext::host(), o);
    w->wait();
    std::vector<int> arrived = w->contributors();
    if (!deadline) {  // the allreduce: every member
      arrived.clear();
      for (int m : group_members(o, world.rank, world.size))
        if (m != world.rank) arrived.push_back(m);
    }
    for (int64_t k = 0; k < samples; ++k) {
      const int64_t i = k * stride;
      double sum = straggler_value(world.rank, o.round, i);
      double magnitude = std::abs(sum);
      for (int peer : arrived) {
        const double v = straggler_value(peer, o.round, i);
        sum += v;
        magnitude += std::abs(v);
      }
      const double n = static_cast<double>(arrived.size() + 1);
      const double error = std::abs(x[i] - sum / n) / std::max(magnitude / n, 1e-30);
      if (error > worst) {
        worst = error;
        worst_round = o.round;
      }
    }
  }
  const double seconds = elapsed_us(t0) / 1e6;
  const double rate = world.rank == args.straggler ? 0.0 : args.straggler_rounds / seconds;
  // The slowest of the others.
  const double mine = world.rank == args.straggler ? 1e300 : rate;
  MPI_Allreduce(&mine, &run.rate, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  // The worst error, with its rank and round.
  struct {
    double error;
    int rank;
  } in{worst, world.rank}, out{};
  MPI_Allreduce(&in, &out, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
  run.worst = out.error;
  run.worst_rank = out.rank;
  uint64_t round_of_worst = world.rank == out.rank ? worst_round : 0;
  MPI_Allreduce(&round_of_worst, &run.worst_round, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  comm->barrier()->wait();  // the straggler's last rounds are done everywhere
  return run;
}

void run_straggler(const PrimitivesArgs& args, BenchWorld& world, Report& report) {
  RELAXCC_ENFORCE(args.straggler >= 0 && args.straggler < world.size, InvalidArgument,
                  "--straggler ", args.straggler, ": not a rank of ", world.size);
  CommunicatorPtr comm = relaxcc_communicator(world);
  uint64_t round = 0;
  const StragglerRun base = straggler_rate(args, world, comm, false, true, round, 31000);
  const StragglerRun blocked = straggler_rate(args, world, comm, true, false, round, 31000);
  const StragglerRun with_deadline = straggler_rate(args, world, comm, true, true, round, 31000);
  report.print(detail::concat("# straggler: rank ", args.straggler, " ", args.slowdown,
                              "x slower, compute ", args.compute_ms, " ms per round, ",
                              args.straggler_rounds, " rounds of group averaging over all ranks"));
  char line[512];
  std::snprintf(line, sizeof line,
                "# others' rounds/s: no straggler (adaptive deadline) %.2f; straggler, no "
                "deadline %.2f (%.2fx); straggler, adaptive deadline %.2f (%.2fx)",
                base.rate, blocked.rate, blocked.rate / base.rate, with_deadline.rate,
                with_deadline.rate / base.rate);
  report.print(line);
  std::snprintf(line, sizeof line,
                "# worst |x - avg over the ranks that arrived| / mean|inputs| per round (bound): "
                "no straggler %.2e (%.2e); straggler, no deadline %.2e (%.2e); straggler, "
                "adaptive deadline %.2e (%.2e)",
                base.worst, base.bound, blocked.worst, blocked.bound, with_deadline.worst,
                with_deadline.bound);
  report.print(line);
  report.add(Row()
                 .set("mode", "primitives_straggler")
                 .set("ranks", world.size)
                 .set("straggler", args.straggler)
                 .set("slowdown", args.slowdown)
                 .set("rounds_per_s_base", base.rate)
                 .set("rounds_per_s_no_deadline", blocked.rate)
                 .set("rounds_per_s_deadline", with_deadline.rate)
                 .set("deadline_vs_base", with_deadline.rate / base.rate)
                 .set("max_rel_error_base", base.worst)
                 .set("max_rel_error_no_deadline", blocked.worst)
                 .set("max_rel_error_deadline", with_deadline.worst)
                 .set("rel_error_bound_deadline", with_deadline.bound)
                 .set("rel_error_bound_no_deadline", blocked.bound));
  const std::pair<const char*, const StragglerRun*> runs[] = {
      {"no straggler (adaptive deadline)", &base},
      {"straggler, no deadline", &blocked},
      {"straggler, adaptive deadline", &with_deadline}};
  for (const auto& [what, r] : runs)
    if (r->worst > r->bound)
      RELAXCC_THROW(InternalError, "primitives --straggler, ", what, ": rank ", r->worst_rank,
                    " round ", r->worst_round,
                    ": expected the result within its stated error of the average over the "
                    "ranks that arrived (|x - avg| / mean|inputs| <= ",
                    r->bound, "), got ", r->worst);
}

}  // namespace

void add_primitives_mode(CLI::App& app) {
  auto args = std::make_shared<PrimitivesArgs>();
  CLI::App* sub = app.add_subcommand(
      "primitives",
      "Relaxed primitives (gossip, CHOCO, Moshpit, async averaging) vs MPI_Allreduce");
  sub->add_option("-b,--bytes", args->bytes, "Tensor size per rank")->capture_default_str();
  sub->add_option("-n,--iters", args->iters, "Timed rounds")->capture_default_str();
  sub->add_option("-w,--warmup", args->warmup, "Untimed rounds")->capture_default_str();
  sub->add_option("--primitives", args->primitives,
                  "mpi, mpi_pairs (shift_one's exchange in plain MPI), all, ring, shift_one, "
                  "exponential, choco, moshpit, async, allreduce (the relaxcc ring), "
                  "compressed_<8bit|4bit|2bit|1bit|f16|bf16|f32>, "
                  "auto (the auto codec; RELAXCC_AUTO_CODEC forces a choice), topk (top-k sparse "
                  "allreduce keeping 1%), topk_<ratio>")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--straggler", args->straggler,
                  "Rank made slower in the straggler run (none: no straggler run)");
  sub->add_option("--slowdown", args->slowdown, "How much slower")->capture_default_str();
  sub->add_option("--compute-ms", args->compute_ms, "Emulated compute per round")
      ->capture_default_str();
  sub->add_option("--straggler-rounds", args->straggler_rounds, "Rounds per straggler run")
      ->capture_default_str();
  sub->add_option("--rate-mbit", args->rate_mbit,
                  "The link rate the run is shaped to, recorded in the JSON rows (0: unshaped)");
  sub->add_option("--segment-bytes", args->segment_bytes,
                  "Pipeline segment of the compressed allreduce (f32 bytes; default: the "
                  "library's)");
  sub->add_option("--shares", args->shares,
                  "equal, balanced: run each sharded primitive (allreduce, compressed_*, auto, "
                  "topk) once per setting; balanced takes its shares from --rates")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--rates", args->rates,
                  "Link rate of each rank's host (any unit; relaxcc-hosts --rates), for "
                  "--shares balanced")
      ->delimiter(',');
  sub->add_option("--json", args->json, "Append JSON Lines rows to this file");
  add_transport_option(sub, args->transport);
  sub->callback([args] {
    BenchWorld world;
    world.transport = args->transport;
    Report report(world.rank == 0, args->json);
    if (!args->primitives.empty() && args->iters > 0) run_rows(*args, world, report);
    if (args->straggler >= 0) run_straggler(*args, world, report);
  });
}

}  // namespace relaxcc::bench
