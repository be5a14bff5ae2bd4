// The element-wise CUDA kernels of the relaxed primitives' device path
// (kernels/cuda/cuda_kernels.h: sum, subtract_from, add, scale,
// first_non_finite, fill, copy) against the same arithmetic on the host,
// bit for bit, and error feedback built from them against
// kernels::compress_with_feedback. Every case skips, with the reason, where
// no CUDA device is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "relaxcc/errors.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/kernels/cuda_runtime.h"
#include "relaxcc/kernels/error_feedback.h"

namespace relaxcc::kernels {
namespace {

class DeviceOps : public ::testing::Test {
 protected:
  void SetUp() override {
    const CudaAvailability cuda = cuda_availability();
    if (cuda.device_count == 0) GTEST_SKIP() << "no CUDA device: " << cuda.reason;
    cuda::set_device(0);
  }
  // Device copies of host floats, and back (legacy default stream).
  static std::shared_ptr<void> upload(const std::vector<float>& v) {
    std::shared_ptr<void> d = cuda::allocate(v.size() * sizeof(float), 0, nullptr);
    cuda::copy_async(d.get(), v.data(), v.size() * sizeof(float), nullptr);
    cuda::synchronize(nullptr);
    return d;
  }
  static std::vector<float> download(const std::shared_ptr<void>& d, size_t n) {
    std::vector<float> v(n);
    cuda::copy_async(v.data(), d.get(), n * sizeof(float), nullptr);
    cuda::synchronize(nullptr);
    return v;
  }
  static float* f(const std::shared_ptr<void>& d) { return static_cast<float*>(d.get()); }
};

// Values across magnitudes, so that rounding differences would show.
std::vector<float> values(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = u(rng) * std::ldexp(1.0f, static_cast<int>(i % 40) - 20);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_F(DeviceOps, ElementwiseEqualsHostBitForBit) {
  const size_t n = 300001;  // more than one grid-stride pass at 65535 blocks of 256
  const std::vector<float> x = values(n, 1), y = values(n, 2);
  const auto dx = upload(x), dy = upload(y), out = upload(std::vector<float>(n));
  std::vector<float> want(n);

  cuda::sum(f(out), f(dx), f(dy), static_cast<int64_t>(n), nullptr);
  for (size_t i = 0; i < n; ++i) want[i] = x[i] + y[i];
  EXPECT_TRUE(same_bits(download(out, n), want)) << "sum";

  cuda::subtract_from(f(out), f(dx), static_cast<int64_t>(n), nullptr);  // out = x - (x + y)
  for (size_t i = 0; i < n; ++i) want[i] = x[i] - want[i];
  EXPECT_TRUE(same_bits(download(out, n), want)) << "subtract_from";

  cuda::add(f(out), f(dy), static_cast<int64_t>(n), nullptr);
  for (size_t i = 0; i < n; ++i) want[i] += y[i];
  EXPECT_TRUE(same_bits(download(out, n), want)) << "add";

  cuda::scale(f(out), static_cast<int64_t>(n), 3.0f, true, nullptr);
  for (size_t i = 0; i < n; ++i) want[i] /= 3.0f;
  EXPECT_TRUE(same_bits(download(out, n), want)) << "divide";

  cuda::scale(f(out), static_cast<int64_t>(n), 0.1f, false, nullptr);
  for (size_t i = 0; i < n; ++i) want[i] *= 0.1f;
  EXPECT_TRUE(same_bits(download(out, n), want)) << "multiply";

  cuda::fill_async(out.get(), 0xff, n * sizeof(float), nullptr);
  const std::vector<float> filled = download(out, n);
  for (size_t i = 0; i < n; i += 9973) EXPECT_TRUE(std::isnan(filled[i])) << i;
}

TEST_F(DeviceOps, FirstNonFiniteFindsTheSmallestIndex) {
  const size_t n = 1 << 20;
  std::vector<float> x = values(n, 3);
  EXPECT_EQ(cuda::first_non_finite(f(upload(x)), static_cast<int64_t>(n), nullptr), -1);
  x[777777] = INFINITY;
  x[500001] = NAN;
  x[900000] = -INFINITY;
  EXPECT_EQ(cuda::first_non_finite(f(upload(x)), static_cast<int64_t>(n), nullptr), 500001);
  EXPECT_EQ(cuda::first_non_finite(nullptr, 0, nullptr), -1);
}

// e = x + r; payload = encode(e); r = e - decode(payload), composed from the
// device kernels as the device backend does, equals the host's error
// feedback: payload and residual bit for bit.
TEST_F(DeviceOps, ErrorFeedbackEqualsHost) {
  const int64_t n = 70000;
  CompressorConfig c;
  c.kind = CompressorKind::minmax;
  c.bits = 4;
  c.chunk = 256;
  const std::vector<float> x = values(static_cast<size_t>(n), 4);
  std::vector<float> residual = values(static_cast<size_t>(n), 5);
  for (float& v : residual) v *= 1e-3f;
  const auto dx = upload(x), dr = upload(residual), scratch = upload(std::vector<float>(n));
  const size_t bytes = encoded_size(n, c);
  std::shared_ptr<void> dp = cuda::allocate(bytes, 0, nullptr);
  std::span<std::byte> device_payload(static_cast<std::byte*>(dp.get()), bytes);
  ExecContext ctx;
  ctx.device = Device::cuda(0);
  cuda::sum(f(scratch), f(dx), f(dr), n, nullptr);
  encode(TensorView(scratch.get(), n, DType::f32, ctx.device), device_payload, c, ctx);
  decode(device_payload, TensorView(dr.get(), n, DType::f32, ctx.device), ctx);
  cuda::subtract_from(f(dr), f(scratch), n, nullptr);

  std::vector<float> host_scratch(static_cast<size_t>(n));
  std::vector<std::byte> host_payload(bytes);
  compress_with_feedback(TensorView::host(const_cast<float*>(x.data()), n), residual, host_scratch,
                         host_payload, c, ExecContext::host());
  std::vector<std::byte> got(bytes);
  cuda::copy_async(got.data(), dp.get(), bytes, nullptr);
  cuda::synchronize(nullptr);
  EXPECT_EQ(got, host_payload);
  EXPECT_TRUE(same_bits(download(dr, static_cast<size_t>(n)), residual));
}

// decode_accumulate on the device (what the owner's sum runs) adds exactly
// what the host's does, for every dense kind the device path encodes.
TEST_F(DeviceOps, DecodeAccumulateEqualsHost) {
  const int64_t n = 50001;
  const std::vector<float> x = values(static_cast<size_t>(n), 6), acc = values(n, 7);
  ExecContext gpu;
  gpu.device = Device::cuda(0);
  for (CompressorKind kind : {CompressorKind::f16, CompressorKind::bf16, CompressorKind::minmax}) {
    for (int bits : {8, 4, 2, 1}) {
      CompressorConfig c;
      c.kind = kind;
      c.bits = bits;
      c.chunk = 1000;
      std::vector<std::byte> payload(encoded_size(n, c));
      encode(TensorView::host(const_cast<float*>(x.data()), n), payload, c, ExecContext::host());
      std::shared_ptr<void> dp = cuda::allocate(payload.size(), 0, nullptr);
      cuda::copy_async(dp.get(), payload.data(), payload.size(), nullptr);
      const auto dacc = upload(acc);
      decode_accumulate(
          std::span<const std::byte>(static_cast<const std::byte*>(dp.get()), payload.size()),
          TensorView(dacc.get(), n, DType::f32, gpu.device), gpu);
      std::vector<float> want = acc;
      decode_accumulate(payload, TensorView::host(want.data(), n), ExecContext::host());
      EXPECT_TRUE(same_bits(download(dacc, static_cast<size_t>(n)), want))
          << compressor_name(kind) << " bits " << bits;
      if (kind != CompressorKind::minmax) break;
    }
  }
}

// The device top-k encoder (kernels/cuda/topk.cu's radix select) writes the
// host encoder's payload byte for byte: the same indices (ties to the lower
// index) and values, on data whose values encode their index, data with
// many ties and signed zeros, and values across magnitudes; k = 1, k = n
// and in between; exact and approximate (the host's approximate selection
// keeps the same k).
TEST_F(DeviceOps, TopkEqualsHostBitForBit) {
  ExecContext gpu;
  gpu.device = Device::cuda(0);
  for (const int64_t n : {int64_t{1}, int64_t{5}, int64_t{4097}, int64_t{100003}}) {
    std::vector<std::vector<float>> inputs;
    std::vector<float> index(static_cast<size_t>(n)), ties(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      index[static_cast<size_t>(i)] = static_cast<float>(i % 2 ? -(i + 1) : i + 1);
      const float t = static_cast<float>(i % 7 - 3) * 0.5f;
      ties[static_cast<size_t>(i)] = i % 11 == 0 ? -0.0f : t;
    }
    inputs.push_back(index);
    inputs.push_back(ties);
    inputs.push_back(values(static_cast<size_t>(n), 9));
    for (size_t v = 0; v < inputs.size(); ++v) {
      const auto dx = upload(inputs[v]);
      for (const int64_t k : {int64_t{1}, int64_t{2}, n / 3, n - 1, n}) {
        if (k < 1) continue;
        for (const bool approximate : {false, true}) {
          CompressorConfig c;
          c.kind = CompressorKind::topk;
          c.keep = k;
          c.approximate = approximate;
          std::vector<std::byte> want(encoded_size(n, c)), got(want.size());
          encode(TensorView::host(inputs[v].data(), n), want, c, ExecContext::host());
          std::shared_ptr<void> dp = cuda::allocate(want.size(), 0, nullptr);
          encode(TensorView(dx.get(), n, DType::f32, gpu.device),
                 std::span(static_cast<std::byte*>(dp.get()), want.size()), c, gpu);
          cuda::copy_async(got.data(), dp.get(), got.size(), nullptr);
          cuda::synchronize(nullptr);
          EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0)
              << "input " << v << " n " << n << " k " << k << " approximate " << approximate;
        }
      }
    }
  }
}

// The device top-k encoder refuses a non-finite input as the host does.
TEST_F(DeviceOps, TopkRefusesNonFiniteInput) {
  ExecContext gpu;
  gpu.device = Device::cuda(0);
  std::vector<float> x = values(1000, 10);
  x[321] = NAN;
  const auto dx = upload(x);
  CompressorConfig c;
  c.kind = CompressorKind::topk;
  c.keep = 10;
  std::shared_ptr<void> dp = cuda::allocate(encoded_size(1000, c), 0, nullptr);
  EXPECT_THROW(encode(TensorView(dx.get(), 1000, DType::f32, gpu.device),
                      std::span(static_cast<std::byte*>(dp.get()), encoded_size(1000, c)), c, gpu),
               InvalidArgument);
}

}  // namespace
}  // namespace relaxcc::kernels
