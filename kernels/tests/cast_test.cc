// Cast kernels agree with the scalar reference of relaxcc/half.h bit for bit,
// on every CPU path and, where a GPU is visible, on CUDA.
#include <bit>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_buffer.h"
#include "relaxcc/config.h"
#include "relaxcc/errors.h"
#include "relaxcc/kernels/cast.h"
#include "relaxcc/kernels/cuda_runtime.h"
#include "relaxcc/thread_pool.h"

namespace relaxcc::kernels {
namespace {

// Every f16/bf16 bit pattern, and f32 inputs that hit every rounding case:
// all f16 midpoints, their neighbours, and random bit patterns.
std::vector<float> probe_floats() {
  std::vector<float> v;
  for (uint32_t h = 0; h < 65536; ++h) v.push_back(f16_bits_to_f32(static_cast<uint16_t>(h)));
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    const float mid =
        static_cast<float>((static_cast<double>(f16_bits_to_f32(static_cast<uint16_t>(h))) +
                            f16_bits_to_f32(static_cast<uint16_t>(h + 1))) /
                           2);
    v.push_back(mid);
    v.push_back(-mid);
    v.push_back(std::bit_cast<float>(std::bit_cast<uint32_t>(mid) + 1));
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  return v;
}

std::vector<uint16_t> all_16bit() {
  std::vector<uint16_t> v(65536);
  for (uint32_t i = 0; i < 65536; ++i) v[i] = static_cast<uint16_t>(i);
  return v;
}

TEST(Cast, HostMatchesReferenceBitForBit) {
  std::printf("CPU f16 path: %s\n", cpu_f16_path());
  ThreadPool pool(2);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    const ExecContext ctx = ExecContext::host(p);
    auto floats = probe_floats();
    const int64_t n = static_cast<int64_t>(floats.size());
    std::vector<uint16_t> h(n), b(n);
    cast(TensorView::host(floats.data(), n), TensorView{h.data(), n, DType::f16}, ctx);
    cast(TensorView::host(floats.data(), n), TensorView{b.data(), n, DType::bf16}, ctx);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(h[i], f32_to_f16_bits(floats[i])) << std::hex << std::bit_cast<uint32_t>(floats[i]);
      ASSERT_EQ(b[i], f32_to_bf16_bits(floats[i]))
          << std::hex << std::bit_cast<uint32_t>(floats[i]);
    }
    auto bits = all_16bit();
    std::vector<float> back(65536);
    cast(TensorView{bits.data(), 65536, DType::f16}, TensorView::host(back.data(), 65536), ctx);
    for (uint32_t i = 0; i < 65536; ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(back[i]),
                std::bit_cast<uint32_t>(f16_bits_to_f32(static_cast<uint16_t>(i))))
          << std::hex << i;
    cast(TensorView{bits.data(), 65536, DType::bf16}, TensorView::host(back.data(), 65536), ctx);
    for (uint32_t i = 0; i < 65536; ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(back[i]),
                std::bit_cast<uint32_t>(bf16_bits_to_f32(static_cast<uint16_t>(i))))
          << std::hex << i;
  }
}

TEST(Cast, RejectsBadInput) {
  const ExecContext ctx = ExecContext::host();
  std::vector<float> f(4);
  std::vector<uint16_t> h(3);
  EXPECT_THROW(cast(TensorView::host(f.data(), 4), TensorView{h.data(), 3, DType::f16}, ctx),
               InvalidArgument);
  EXPECT_THROW(cast(TensorView{nullptr, 4, DType::f32}, TensorView{h.data(), 4, DType::f16}, ctx),
               InvalidArgument);
  std::vector<int32_t> i(4);
  EXPECT_THROW(cast(TensorView::host(f.data(), 4), TensorView::host(i.data(), 4), ctx),
               Unsupported);
}

TEST(CastGpu, MatchesCpuBitForBit) {
  const auto cuda = cuda_availability();
  if (cuda.device_count == 0) GTEST_SKIP() << "no GPU: " << cuda.reason;
  ExecContext gpu;
  gpu.device = Device::cuda(0);
  auto floats = probe_floats();
  const int64_t n = static_cast<int64_t>(floats.size());
  for (DType t : {DType::f16, DType::bf16}) {
    test::GpuBuffer in(floats.data(), n * 4), out(nullptr, n * 2);
    cast(TensorView{in.get(), n, DType::f32, gpu.device}, TensorView{out.get(), n, t, gpu.device},
         gpu);
    std::vector<uint16_t> got(n), want(n);
    out.copy_to_host(got.data());
    cast(TensorView::host(floats.data(), n), TensorView{want.data(), n, t}, ExecContext::host());
    ASSERT_EQ(got, want) << t;

    auto bits = all_16bit();
    test::GpuBuffer in16(bits.data(), 65536 * 2), out32(nullptr, 65536 * 4);
    cast(TensorView{in16.get(), 65536, t, gpu.device},
         TensorView{out32.get(), 65536, DType::f32, gpu.device}, gpu);
    std::vector<float> g(65536), w(65536);
    out32.copy_to_host(g.data());
    cast(TensorView{bits.data(), 65536, t}, TensorView::host(w.data(), 65536), ExecContext::host());
    ASSERT_EQ(std::memcmp(g.data(), w.data(), 65536 * 4), 0) << t;
  }
}

}  // namespace
}  // namespace relaxcc::kernels
