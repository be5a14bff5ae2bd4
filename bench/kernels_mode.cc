// `relaxcc-bench kernels`: throughput of the compression kernels in GB/s of
// f32 data (the f32 side: input of an encode, output of a decode), next to
// memcpy of the same f32 bytes in the same run, at 1 thread and at all.
// Top-k rows carry recall (against the exact top-k) and k; the baseline row
// "nth_element" selects on a copy of |x| with std::nth_element.
//
// --device cuda[:N]: the CUDA kernels (kernels/cuda/cuda_kernels.h) on device
// memory instead: quantize (minmax encode: 8, 4, 2 and 1 bits, stochastic
// rounding; f16, bf16) and dequantize (decode), each timed to its stream's
// completion, in GB/s of bytes read plus bytes written (encode: the f32
// input and the payload; decode: the payload and the f32 output), next to a
// device-to-device cudaMemcpy of the f32 tensor (read plus written) in the
// same run. Without a visible device it prints the reason and fails.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "modes.h"
#include "relaxcc/errors.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/kernels/cuda_runtime.h"
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
  std::string device = "host";
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

// A codec the bench times, under the name its rows carry.
struct TimedCodec {
  std::string name;
  kernels::CompressorConfig config;
};

// The codecs timed, in the order of the rows: minmax at 8, 4, 2 and 1 bits,
// minmax 8-bit with stochastic rounding, f16 and bf16; on the host also
// sign, randomk and cocktail (10% rolling, top 20%, 4-bit), which have no
// CUDA kernel.
std::vector<TimedCodec> timed_codecs(bool host) {
  std::vector<TimedCodec> out;
  kernels::CompressorConfig c;
  for (int bits : {8, 4, 2, 1}) {
    c = {};
    c.kind = kernels::CompressorKind::minmax;
    c.bits = bits;
    out.push_back({"minmax", c});
  }
  c = {};
  c.kind = kernels::CompressorKind::minmax;
  c.rounding = kernels::Rounding::stochastic;
  out.push_back({"minmax_sr", c});
  std::vector<kernels::CompressorKind> kinds{kernels::CompressorKind::f16,
                                             kernels::CompressorKind::bf16};
  if (host) {
    kinds.push_back(kernels::CompressorKind::sign);
    kinds.push_back(kernels::CompressorKind::randomk);
  }
  for (auto kind : kinds) {
    c = {};
    c.kind = kind;
    out.push_back({kernels::compressor_name(kind), c});
  }
  if (host) {
    c = {};
    c.kind = kernels::CompressorKind::cocktail;
    c.bits = 4;
    c.chunk = 128;
    c.ratio = 0.1;
    c.topk_ratio = 0.2;
    c.random_mode = kernels::RandomKMode::rolling;
    out.push_back({"cocktail", c});
  }
  return out;
}

// The `bits` column of a codec's rows: its width for minmax and cocktail, 0
// for the others.
int bits_column(const kernels::CompressorConfig& c) {
  return c.kind == kernels::CompressorKind::minmax || c.kind == kernels::CompressorKind::cocktail
             ? c.bits
             : 0;
}

// The CUDA kernels on device memory against a device-to-device copy.
void run_device_kernels(const KernelsArgs& args, Device device) {
  const kernels::CudaAvailability cuda = kernels::cuda_availability();
  RELAXCC_ENFORCE(cuda.device_count > 0, Unsupported, "kernels --device ", args.device, ": ",
                  cuda.reason);
  RELAXCC_ENFORCE(device.index < cuda.device_count, InvalidArgument, "kernels --device ",
                  args.device, ": ", cuda.device_count, " CUDA device(s) visible");
  Report report(true, args.json);
  const int64_t n = parse_size(args.elements);
  RELAXCC_ENFORCE(n > 0 && n <= int64_t{UINT32_MAX}, InvalidArgument,
                  "kernels: -n must be in [1, 2^32)");
  kernels::cuda::set_device(device.index);
  std::vector<float> host(static_cast<size_t>(n));
  {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& v : host) v = d(rng);
  }
  const size_t f32_bytes = static_cast<size_t>(n) * 4;
  const std::shared_ptr<void> x = kernels::cuda::allocate(f32_bytes, device.index, nullptr);
  const std::shared_ptr<void> y = kernels::cuda::allocate(f32_bytes, device.index, nullptr);
  kernels::cuda::copy_async(x.get(), host.data(), f32_bytes, nullptr);
  kernels::cuda::synchronize(nullptr);
  ExecContext ctx;
  ctx.device = device;  // the legacy default stream
  report.print(detail::concat("# relaxcc-bench kernels on ", device, ": ", n,
                              " f32 elements, median of ", args.iters,
                              " iterations; gbps counts bytes read plus bytes written"));
  char line[256];
  std::snprintf(line, sizeof line, "%-18s %5s %12s %14s %10s %12s %8s", "kernel", "bits",
                "time(us)", "bytes", "GB/s", "memcpy GB/s", "ratio");
  report.print(line);
  const double memcpy_us = median_us(args.iters, [&] {
    kernels::cuda::copy_async(y.get(), x.get(), f32_bytes, nullptr);
    kernels::cuda::synchronize(nullptr);
  });
  const double memcpy_gbps = 2.0 * static_cast<double>(f32_bytes) / memcpy_us / 1e3;
  auto emit = [&](const std::string& kernel, int bits, double us, double bytes) {
    const double gbps = bytes / us / 1e3;
    std::snprintf(line, sizeof line, "%-18s %5d %12.1f %14.0f %10.3f %12.3f %8.3f", kernel.c_str(),
                  bits, us, bytes, gbps, memcpy_gbps, gbps / memcpy_gbps);
    report.print(line);
    Row row;
    row.set("mode", "kernels")
        .set("device", to_string(device))
        .set("kernel", kernel)
        .set("bits", bits)
        .set("elements", n)
        .set("time_us", us)
        .set("bytes", bytes)
        .set("gbps", gbps)
        .set("memcpy_gbps", memcpy_gbps)
        .set("ratio_to_memcpy", gbps / memcpy_gbps);
    report.add(row);
  };
  emit("memcpy_d2d", 32, memcpy_us, 2.0 * static_cast<double>(f32_bytes));
  auto codec = [&](const std::string& name, kernels::CompressorConfig c) {
    const size_t payload_bytes = kernels::encoded_size(n, c);
    const std::shared_ptr<void> payload =
        kernels::cuda::allocate(payload_bytes, device.index, nullptr);
    const std::span<std::byte> p(static_cast<std::byte*>(payload.get()), payload_bytes);
    const TensorView in(x.get(), n, DType::f32, device), out(y.get(), n, DType::f32, device);
    // encode and decode synchronize the stream (they read the device's
    // validation flag back): each timing ends with the kernels done.
    const double enc = median_us(args.iters, [&] { kernels::encode(in, p, c, ctx); });
    const double dec = median_us(args.iters, [&] { kernels::decode(p, out, ctx); });
    const double moved = static_cast<double>(f32_bytes + payload_bytes);
    emit(name + "_encode", bits_column(c), enc, moved);
    emit(name + "_decode", bits_column(c), dec, moved);
  };
  for (const TimedCodec& t : timed_codecs(false)) codec(t.name, t.config);
}

void run_kernels(const KernelsArgs& args) {
  const Device device = parse_device(args.device);
  if (device.is_cuda()) return run_device_kernels(args, device);
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
      emit(name + "_encode", bits_column(c), enc);
      emit(name + "_decode", bits_column(c), dec);
    };
    for (const TimedCodec& t : timed_codecs(true)) codec(t.name, t.config);
    kernels::CompressorConfig c;

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
  sub->add_option("--device", args->device,
                  "host (the CPU kernels), or cuda[:N]: the CUDA kernels on device memory "
                  "against a device-to-device copy")
      ->capture_default_str();
  sub->callback([args] { run_kernels(*args); });
}

}  // namespace relaxcc::bench
