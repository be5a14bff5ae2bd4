// `relaxcc-bench kernels`: throughput of the compression kernels in GB/s of
// f32 data (the f32 side: input of an encode, output of a decode), next to
// memcpy of the same f32 bytes in the same run, at 1 thread and at all.
// Top-k rows carry recall (against the exact top-k) and k; the baseline row
// "nth_element" selects on a copy of |x| with std::nth_element.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "modes.h"
#include "relaxcc/errors.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/thread_pool.h"
#include "relaxcc/tunables.h"
#include "report.h"

namespace relaxcc::bench {

namespace {

struct KernelsArgs {
  std::string elements = "64M";
  int iters = 5;
  std::vector<int> threads{1, 0};
  std::string json;
};

template <typename Fn>
double median_us(int iters, Fn&& fn) {
  std::vector<double> t;
  fn();  // warm-up: page faults, caches
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void run_kernels(const KernelsArgs& args) {
  Report report(true, args.json);
  const int64_t n = parse_size(args.elements);
  RELAXCC_ENFORCE(n > 0 && n <= int64_t{UINT32_MAX}, InvalidArgument,
                  "kernels: -n must be in [1, 2^32)");
  std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
  {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& v : x) v = d(rng);
  }
  const double f32_bytes = static_cast<double>(n) * 4;
  report.print(detail::concat("# relaxcc-bench kernels: ", n, " f32 elements, median of ",
                              args.iters, " iterations; gbps counts the f32 side"));
  char line[256];
  std::snprintf(line, sizeof line, "%-18s %5s %8s %12s %10s %12s %8s %8s %10s", "kernel", "bits",
                "threads", "time(us)", "GB/s", "memcpy GB/s", "ratio", "recall", "k");
  report.print(line);

  for (int requested : args.threads) {
    const int threads = requested > 0
                            ? requested
                            : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    auto pool = std::make_unique<ThreadPool>(threads);
    const ExecContext ctx = ExecContext::host(threads > 1 ? pool.get() : nullptr);
    const double memcpy_us = median_us(args.iters, [&] {
      pool->parallel_for(n, 1 << 20, [&](int64_t b, int64_t e) {
        std::memcpy(y.data() + b, x.data() + b, static_cast<size_t>(e - b) * 4);
      });
    });
    const double memcpy_gbps = f32_bytes / memcpy_us / 1e3;
    auto emit = [&](const std::string& kernel, int bits, double us, double recall = -1,
                    int64_t k = -1) {
      const double gbps = f32_bytes / us / 1e3;
      std::snprintf(line, sizeof line, "%-18s %5d %8d %12.1f %10.3f %12.3f %8.3f %8s %10s",
                    kernel.c_str(), bits, threads, us, gbps, memcpy_gbps, gbps / memcpy_gbps,
                    recall >= 0 ? detail::concat(recall).c_str() : "",
                    k >= 0 ? std::to_string(k).c_str() : "");
      report.print(line);
      Row row;
      row.set("mode", "kernels")
          .set("kernel", kernel)
          .set("bits", bits)
          .set("threads", threads)
          .set("elements", n)
          .set("time_us", us)
          .set("gbps", gbps)
          .set("memcpy_gbps", memcpy_gbps)
          .set("ratio_to_memcpy", gbps / memcpy_gbps);
      if (recall >= 0) row.set("recall", recall).set("k", k);
      report.add(row);
    };
    emit("memcpy", 32, memcpy_us);

    auto codec = [&](const std::string& name, kernels::CompressorConfig c) {
      std::vector<std::byte> payload(kernels::encoded_size(n, c));
      const TensorView in = TensorView::host(x.data(), n), out = TensorView::host(y.data(), n);
      const double enc = median_us(args.iters, [&] { kernels::encode(in, payload, c, ctx); });
      const double dec = median_us(args.iters, [&] { kernels::decode(payload, out, ctx); });
      const int bits =
          c.kind == kernels::CompressorKind::minmax || c.kind == kernels::CompressorKind::cocktail
              ? c.bits
              : 0;
      emit(name + "_encode", bits, enc);
      emit(name + "_decode", bits, dec);
    };
    kernels::CompressorConfig c;
    for (int bits : {8, 4, 2, 1}) {
      c = {};
      c.kind = kernels::CompressorKind::minmax;
      c.bits = bits;
      codec("minmax", c);
    }
    c = {};
    c.kind = kernels::CompressorKind::minmax;
    c.rounding = kernels::Rounding::stochastic;
    codec("minmax_sr", c);
    for (auto kind : {kernels::CompressorKind::f16, kernels::CompressorKind::bf16,
                      kernels::CompressorKind::sign, kernels::CompressorKind::randomk}) {
      c = {};
      c.kind = kind;
      codec(kernels::compressor_name(kind), c);
    }
    c = {};
    c.kind = kernels::CompressorKind::cocktail;
    c.bits = 4;
    c.chunk = 128;
    c.ratio = 0.1;
    c.topk_ratio = 0.2;
    c.random_mode = kernels::RandomKMode::rolling;
    codec("cocktail", c);

    // Top-1%: the baseline, then relaxcc's exact and approximate selections.
    const int64_t k = std::max<int64_t>(1, n / 100);
    std::vector<float> mags(static_cast<size_t>(n));
    float kth = 0;
    const double nth_us = median_us(args.iters, [&] {
      for (int64_t i = 0; i < n; ++i) mags[i] = std::fabs(x[i]);
      std::nth_element(mags.begin(), mags.begin() + (k - 1), mags.end(), std::greater<float>());
      kth = mags[k - 1];
    });
    emit("nth_element", 32, nth_us, 1.0, k);
    for (bool approximate : {false, true}) {
      c = {};
      c.kind = kernels::CompressorKind::topk;
      c.keep = k;
      c.approximate = approximate;
      std::vector<std::byte> payload(kernels::encoded_size(n, c));
      const double us = median_us(
          args.iters, [&] { kernels::encode(TensorView::host(x.data(), n), payload, c, ctx); });
      const kernels::PayloadHeader h = kernels::read_header(payload);
      std::vector<uint32_t> idx(static_cast<size_t>(h.k));
      std::memcpy(idx.data(), payload.data() + sizeof(kernels::PayloadHeader), idx.size() * 4);
      int64_t hits = 0;
      for (uint32_t i : idx) hits += std::fabs(x[i]) >= kth;
      emit(approximate ? "topk_approx" : "topk_exact", 32, us,
           static_cast<double>(hits) / static_cast<double>(k), h.k);
    }
  }
}

}  // namespace

void add_kernels_mode(CLI::App& app) {
  auto args = std::make_shared<KernelsArgs>();
  CLI::App* sub = app.add_subcommand("kernels", "Compression kernel throughput against memcpy");
  sub->add_option("-n,--elements", args->elements, "f32 elements (K/M/G)")->capture_default_str();
  sub->add_option("-i,--iters", args->iters, "Timed iterations (median)")->capture_default_str();
  sub->add_option("-t,--threads", args->threads, "Thread counts; 0 = every hardware thread")
      ->delimiter(',')
      ->capture_default_str();
  sub->add_option("--json", args->json, "Append JSON Lines rows to this file");
  sub->callback([args] { run_kernels(*args); });
}

}  // namespace relaxcc::bench
