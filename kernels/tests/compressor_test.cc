// Compressors: sizes, error bounds, rounding, selections, error feedback and
// hardened decoders. GPU cases compare with the CPU bit for bit.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_buffer.h"
#include "relaxcc/errors.h"
#include "relaxcc/half.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/kernels/cuda_runtime.h"
#include "relaxcc/kernels/error_feedback.h"
#include "relaxcc/kernels/philox.h"
#include "relaxcc/thread_pool.h"

namespace relaxcc::kernels {
namespace {

std::vector<float> gaussian(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

struct Encoded {
  std::vector<std::byte> bytes;
  std::span<const std::byte> span() const { return bytes; }
};

Encoded encode_vec(const std::vector<float>& x, const CompressorConfig& c,
                   const ExecContext& ctx = ExecContext::host()) {
  Encoded e;
  e.bytes.resize(encoded_size(static_cast<int64_t>(x.size()), c));
  const size_t written =
      encode(TensorView::host(const_cast<float*>(x.data()), static_cast<int64_t>(x.size())),
             e.bytes, c, ctx);
  EXPECT_EQ(written, e.bytes.size());
  return e;
}

std::vector<float> decode_vec(const Encoded& e, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n), -7.0f);
  decode(e.span(), TensorView::host(out.data(), n), ExecContext::host());
  return out;
}

CompressorConfig make(CompressorKind kind, int bits = 8, int64_t chunk = 2048) {
  CompressorConfig c;
  c.kind = kind;
  c.bits = bits;
  c.chunk = chunk;
  return c;
}

const CompressorKind kKinds[] = {
    CompressorKind::f16,  CompressorKind::bf16,    CompressorKind::minmax,  CompressorKind::sign,
    CompressorKind::topk, CompressorKind::randomk, CompressorKind::cocktail};

TEST(Philox, KnownAnswers) {
  // Random123's known-answer vectors for philox4x32-10.
  auto r = philox4x32(0, 0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
  r = philox4x32(~0ull, ~0ull, ~0ull);
  EXPECT_EQ(r.v[0], 0x408f276du);
  EXPECT_EQ(r.v[1], 0x41c83b0eu);
  EXPECT_EQ(r.v[2], 0xa20bc7c6u);
  EXPECT_EQ(r.v[3], 0x6d5451fdu);
  r = philox4x32(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull);
  EXPECT_EQ(r.v[0], 0xd16cfe09u);
  EXPECT_EQ(r.v[1], 0x94fdccebu);
  EXPECT_EQ(r.v[2], 0x5001e420u);
  EXPECT_EQ(r.v[3], 0x24126ea1u);
}

TEST(Compressor, EncodedSizeEqualsBytesWritten) {
  for (CompressorKind kind : kKinds) {
    for (int bits : {8, 4, 2, 1}) {
      for (int64_t n : {0, 1, 7, 127, 2047, 2048, 2049, 100003}) {
        CompressorConfig c = make(kind, bits, kind == CompressorKind::cocktail ? 128 : 2048);
        c.ratio = kind == CompressorKind::cocktail ? 0.1 : 0.05;
        const auto x = gaussian(n, 3);
        const Encoded e = encode_vec(x, c);  // checks written == encoded_size
        const PayloadHeader h = read_header(e.span());
        EXPECT_EQ(h.n, n);
        EXPECT_EQ(h.k, kept_elements(n, c)) << compressor_name(kind) << " n " << n;
        const bool sparse = kind == CompressorKind::topk || kind == CompressorKind::randomk ||
                            kind == CompressorKind::cocktail;
        if (sparse && n > 0) {
          EXPECT_GE(h.k, 1);
        }
        const auto y = decode_vec(e, n);
        EXPECT_EQ(y.size(), static_cast<size_t>(n));
      }
    }
  }
  // The reported ratio counts everything that travels.
  CompressorConfig c = make(CompressorKind::minmax, 8, 2048);
  EXPECT_NEAR(compression_ratio(1 << 20, c), 4.0 * (1 << 20) / (48 + 512 * (8 + 2048)), 1e-9);
  CompressorConfig cocktail = make(CompressorKind::cocktail, 4, 128);
  cocktail.ratio = 0.1;
  cocktail.topk_ratio = 0.2;
  const int64_t k = kept_elements(1 << 20, cocktail);
  EXPECT_EQ(k, static_cast<int64_t>(std::ceil(0.2 * std::ceil(0.1 * (1 << 20)))));
  EXPECT_NEAR(compression_ratio(1 << 20, cocktail),
              4.0 * (1 << 20) / (48 + 4.0 * k + ((k + 127) / 128) * 8 + (k * 4 + 7) / 8), 1e-6);
}

TEST(MinMax, RoundToNearestErrorBound) {
  for (int bits : {8, 4, 2, 1}) {
    for (int64_t chunk : {1, 100, 2048}) {
      const int64_t n = 10007;
      auto x = gaussian(n, 11 + bits, 3.0f);
      const auto y = decode_vec(encode_vec(x, make(CompressorKind::minmax, bits, chunk)), n);
      for (int64_t c0 = 0; c0 < n; c0 += chunk) {
        const int64_t len = std::min(chunk, n - c0);
        const float mn = *std::min_element(x.begin() + c0, x.begin() + c0 + len);
        const float mx = *std::max_element(x.begin() + c0, x.begin() + c0 + len);
        const double bound = (static_cast<double>(mx) - mn) / ((1 << bits) - 1) / 2;
        for (int64_t i = c0; i < c0 + len; ++i) {
          const double ulp = std::nextafter(std::fabs(x[i]), INFINITY) - std::fabs(x[i]);
          ASSERT_LE(std::fabs(static_cast<double>(x[i]) - y[i]), bound + 2 * std::max(ulp, 1e-30))
              << "bits " << bits << " chunk " << chunk << " i " << i;
        }
      }
    }
  }
}

TEST(MinMax, EdgeCases) {
  // A constant chunk encodes exactly; n not a multiple of the chunk; n = 0.
  std::vector<float> x(5000, 3.25f);
  for (int64_t i = 4096; i < 5000; ++i) x[i] = -1.5f;
  for (int bits : {8, 1}) {
    const auto y = decode_vec(encode_vec(x, make(CompressorKind::minmax, bits, 2048)), 5000);
    EXPECT_EQ(y, x);
  }
  EXPECT_TRUE(decode_vec(encode_vec({}, make(CompressorKind::minmax)), 0).empty());
  // Non-finite input is refused with the element's index.
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    auto z = gaussian(3000, 5);
    z[2500] = bad;
    for (CompressorKind kind : {CompressorKind::minmax, CompressorKind::f16, CompressorKind::sign,
                                CompressorKind::topk}) {
      try {
        encode_vec(z, make(kind));
        ADD_FAILURE() << compressor_name(kind) << " accepted " << bad;
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find("2500"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(MinMax, CodesMatchTheScalarReference) {
  // Whatever path the CPU takes (AVX2 or scalar), codes equal the formula.
  const int64_t n = 4099;
  const auto x = gaussian(n, 21);
  const Encoded e = encode_vec(x, make(CompressorKind::minmax, 8, 4099));
  float mn, s;
  std::memcpy(&mn, e.bytes.data() + 48, 4);
  std::memcpy(&s, e.bytes.data() + 52, 4);
  EXPECT_EQ(mn, *std::min_element(x.begin(), x.end()));
  EXPECT_EQ(s, 255.0f / (*std::max_element(x.begin(), x.end()) - mn));
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::nearbyint((x[i] - mn) * s);
    const auto want = static_cast<unsigned char>(std::clamp(v, 0.0f, 255.0f));
    ASSERT_EQ(static_cast<unsigned char>(e.bytes[56 + i]), want) << i;
  }
}

TEST(MinMax, PackedCodesMatchTheScalarReference) {
  // 4, 2 and 1 bits: codes of the formula, packed little-endian within each
  // byte, whatever path packs them (AVX2 32 codes at a time, scalar tails);
  // decoding gives min + code / scale back.
  const int64_t n = 4099;
  const auto x = gaussian(n, 23);
  for (int bits : {4, 2, 1}) {
    const Encoded e = encode_vec(x, make(CompressorKind::minmax, bits, 4099));
    float mn, s;
    std::memcpy(&mn, e.bytes.data() + 48, 4);
    std::memcpy(&s, e.bytes.data() + 52, 4);
    const float levels = static_cast<float>((1 << bits) - 1);
    const int per = 8 / bits;
    std::vector<unsigned char> want((n * bits + 7) / 8, 0);
    std::vector<unsigned> code(n);
    for (int64_t i = 0; i < n; ++i) {
      code[i] = static_cast<unsigned>(std::clamp(std::nearbyint((x[i] - mn) * s), 0.0f, levels));
      want[i / per] |= static_cast<unsigned char>(code[i] << ((i % per) * bits));
    }
    for (size_t b = 0; b < want.size(); ++b)
      ASSERT_EQ(static_cast<unsigned char>(e.bytes[56 + b]), want[b])
          << bits << " bits, byte " << b;
    const std::vector<float> back = decode_vec(e, n);
    const float inv = 1.0f / s;
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(back[i], mn + static_cast<float>(code[i]) * inv) << bits << " bits, element " << i;
  }
}

TEST(MinMax, StochasticRoundingIsUnbiasedAndReproducible) {
  const int64_t n = 512;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i)
    x[i] = static_cast<float>(i % 37) / 36.0f + 0.0123f * static_cast<float>(i % 5);
  CompressorConfig c = make(CompressorKind::minmax, 2, 512);
  c.rounding = Rounding::stochastic;
  const int trials = 4000;
  std::vector<double> mean(n, 0.0);
  for (int t = 0; t < trials; ++t) {
    ExecContext ctx = ExecContext::host();
    ctx.rng = {42, static_cast<uint64_t>(t) * 1000};
    const auto y = [&] {
      Encoded e;
      e.bytes.resize(encoded_size(n, c));
      encode(TensorView::host(x.data(), n), e.bytes, c, ctx);
      return decode_vec(e, n);
    }();
    for (int64_t i = 0; i < n; ++i) mean[i] += y[i] / trials;
  }
  // Step = (max - min) / 3; the rounding error of one trial is at most a step,
  // so the mean's standard error is at most step / (2 sqrt(trials)).
  const double step = (1.0 + 0.0123 * 4 - 0.0) / 3.0;
  const double tolerance = 6 * step / (2 * std::sqrt(trials));
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(mean[i], x[i], tolerance) << i;
  // Same (seed, offset): same payload, on every rank and device.
  ExecContext ctx = ExecContext::host();
  ctx.rng = {7, 99};
  Encoded a, b;
  a.bytes.resize(encoded_size(n, c));
  b.bytes.resize(encoded_size(n, c));
  encode(TensorView::host(x.data(), n), a.bytes, c, ctx);
  encode(TensorView::host(x.data(), n), b.bytes, c, ctx);
  EXPECT_EQ(a.bytes, b.bytes);
}

TEST(MinMax, StochasticRoundingUniformsAreWithinTwoToMinus9OfUnbiased) {
  // Over the 2^8 cells, floor(f + u) = 1 for floor(2^8 f + 1/2) of them:
  // P(round up) is within 2^-9 of f (sums exact: f on a 2^-20 grid). Every
  // f on a 2^-12 grid, so each cell boundary and the points either side.
  for (uint32_t g = 0; g < (1u << 20); g += 1u << 8) {
    for (uint32_t d : {0u, 1u, 255u}) {
      const float f =
          static_cast<float>(std::min(g + d, (1u << 20) - 1)) / static_cast<float>(1u << 20);
      int64_t up = 0;
      for (uint32_t h = 0; h < (1u << 8); ++h)
        up += std::floor(f + static_cast<float>(2 * h + 1) / 512.0f) >= 1.0f;
      ASSERT_EQ(up, static_cast<int64_t>(std::floor(256.0 * f + 0.5))) << f;
      ASSERT_LE(std::fabs(static_cast<double>(up) / 256.0 - f), 1.0 / 512.0) << f;
    }
  }
  // The cells come from Philox: sixteen elements per block, byte i % 4
  // (from the low end) of word (i % 16) / 4.
  const Philox4x32 r = philox4x32(5, 0, 3 + 2);
  for (uint64_t i = 32; i < 48; ++i) {
    const uint32_t h = (r.v[(i % 16) / 4] >> (8 * (i % 4))) & 0xFFu;
    ASSERT_EQ(rounding_uniform(5, 3, i), static_cast<float>(2 * h + 1) / 512.0f) << i;
  }
  // The same, as the block's 16 bytes in little-endian word order.
  unsigned char bytes[16];
  for (int w = 0; w < 4; ++w)
    for (int b = 0; b < 4; ++b) bytes[4 * w + b] = static_cast<unsigned char>(r.v[w] >> (8 * b));
  for (uint64_t i = 32; i < 48; ++i)
    ASSERT_EQ(rounding_uniform(5, 3, i), static_cast<float>(2 * bytes[i % 16] + 1) / 512.0f) << i;
  EXPECT_NE(rounding_uniform(5, 3, 47), rounding_uniform(5, 3, 48));
}

TEST(MinMax, StochasticCodesMatchTheScalarReference) {
  // Whatever path the CPU takes (scalar, AVX2 or AVX-512VL Philox on four
  // counters per vector), each code is floor((x - min) * scale + u) clamped,
  // with u = rounding_uniform of the element's index. Chunks of 1001 start at
  // indices 0, 9, 2 and 11 mod 16, so the vector path's head, body and tail
  // all run; every code width.
  const int64_t n = 4099, chunk = 1001;
  auto x = gaussian(n, 23);
  for (int bits : {8, 4, 2, 1}) {
    CompressorConfig c = make(CompressorKind::minmax, bits, chunk);
    c.rounding = Rounding::stochastic;
    ExecContext ctx = ExecContext::host();
    ctx.rng = {0x1234567890abcdefull, 77};
    Encoded e;
    e.bytes.resize(encoded_size(n, c));
    encode(TensorView::host(x.data(), n), e.bytes, c, ctx);
    const int64_t stride = 8 + (chunk * bits + 7) / 8;
    const auto levels = static_cast<float>((1u << bits) - 1u);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t ch = i / chunk, j = i - ch * chunk;
      const std::byte* p = e.bytes.data() + 48 + ch * stride;
      float mn, s;
      std::memcpy(&mn, p, 4);
      std::memcpy(&s, p + 4, 4);
      const float u =
          kernels::rounding_uniform(ctx.rng.seed, ctx.rng.offset, static_cast<uint64_t>(i));
      const float v = std::floor((x[i] - mn) * s + u);
      const auto want = static_cast<unsigned>(std::clamp(v, 0.0f, levels));
      const unsigned got =
          (static_cast<unsigned>(p[8 + j * bits / 8]) >> (j * bits % 8)) & ((1u << bits) - 1u);
      ASSERT_EQ(got, want) << bits << " bits, element " << i;
    }
  }
}

// Chunks of kTinyChunk elements whose ranges max - min are far below
// (2^bits - 1) / FLT_MAX, where a scale (2^bits - 1) / (max - min) would
// overflow f32: the reported [0, 1e-40] and [0, 1e-38] first, then ramps of
// subnormal and tiny normal values, a range of one subnormal ulp, and
// ranges either side of the pre-scaling threshold 2^-100.
constexpr int64_t kTinyChunk = 17;
std::vector<float> tiny_chunks() {
  std::vector<float> x = {0.0f, 1e-40f, 0.0f, 1e-38f};
  x.resize(kTinyChunk, 0.0f);  // chunk 0: [0, 1e-40, 0, 1e-38, 0...]: range 1e-38
  const float ranges[][2] = {
      {0.0f, 1e-40f},         {0.0f, 1e-38f},      {-3e-39f, 1e-40f},
      {-1e-38f, 2e-38f},      {1e-37f, 1e-44f},    {-2e-36f, 7e-37f},
      {0.0f, 0x1p-149f},      {5e-39f, 0x1p-149f}, {0.0f, std::nextafter(0x1p-100f, 0.0f)},
      {-0x1p-80f, 0x1p-100f}, {1e-30f, 3e-30f}};
  for (const auto& [lo, range] : ranges)
    for (int64_t k = 0; k < kTinyChunk; ++k)
      x.push_back(lo + range * static_cast<float>((k * 7) % kTinyChunk) /
                           static_cast<float>(kTinyChunk - 1));
  return x;
}

// Every element of the tiny chunks decodes into its chunk's [min, max] and
// within `steps` quantization steps (max - min) / (2^bits - 1) of its input,
// besides two ulps of f32 rounding (a subnormal ulp is 2^-149).
void expect_tiny_bound(const std::vector<float>& x, const std::vector<float>& y, int bits,
                       double steps, const std::string& what) {
  for (size_t c0 = 0; c0 < x.size(); c0 += kTinyChunk) {
    const auto first = x.begin() + static_cast<std::ptrdiff_t>(c0);
    const float mn = *std::min_element(first, first + kTinyChunk);
    const float mx = *std::max_element(first, first + kTinyChunk);
    const double step = (static_cast<double>(mx) - mn) / ((1 << bits) - 1);
    for (size_t i = c0; i < c0 + kTinyChunk; ++i) {
      const float a = std::fabs(x[i]);
      const double ulp = static_cast<double>(std::nextafter(a, INFINITY)) - a;
      ASSERT_GE(y[i], mn) << what << " bits " << bits << " element " << i;
      ASSERT_LE(y[i], mx) << what << " bits " << bits << " element " << i;
      ASSERT_LE(std::fabs(static_cast<double>(x[i]) - y[i]), steps * step + 2 * ulp)
          << what << " bits " << bits << " element " << i << ": " << x[i] << " -> " << y[i]
          << ", step " << step;
    }
  }
}

TEST(MinMax, TinyRangesKeepTheBoundAndDecodeWithinTheChunk) {
  const std::vector<float> x = tiny_chunks();
  const auto n = static_cast<int64_t>(x.size());
  // The reported cases, alone in a chunk of two: [0, 1e-40] decoded to [0, 0]
  // and [0, 1e-38] with stochastic rounding to 1.18e-38.
  for (const std::vector<float>& pair :
       {std::vector<float>{0.0f, 1e-40f}, std::vector<float>{0.0f, 1e-38f}}) {
    for (int bits : {8, 4, 2, 1}) {
      for (Rounding rounding : {Rounding::nearest, Rounding::stochastic}) {
        CompressorConfig c = make(CompressorKind::minmax, bits, 2);
        c.rounding = rounding;
        for (uint64_t offset : {0, 1, 2, 3, 50, 777}) {
          ExecContext ctx = ExecContext::host();
          ctx.rng = {9, offset};
          const auto y = decode_vec(encode_vec(pair, c, ctx), 2);
          EXPECT_EQ(y[0], 0.0f) << pair[1] << " bits " << bits;
          // The top code decodes within 2 subnormal ulps below max.
          EXPECT_LE(y[1], pair[1]) << pair[1] << " bits " << bits;
          EXPECT_GE(y[1], pair[1] - 2 * 0x1p-149f) << pair[1] << " bits " << bits;
        }
      }
    }
  }
  for (int bits : {8, 4, 2, 1}) {
    // Round to nearest: half a step.
    const Encoded e = encode_vec(x, make(CompressorKind::minmax, bits, kTinyChunk));
    expect_tiny_bound(x, decode_vec(e, n), bits, 0.5, "nearest");
    // Pre-scaled exactly where the range is below 2^-100 (the last two
    // chunks are not).
    const int64_t stride = 8 + (kTinyChunk * bits + 7) / 8;
    const int64_t chunks = n / kTinyChunk;
    for (int64_t ch = 0; ch < chunks; ++ch) {
      float field;
      std::memcpy(&field, e.bytes.data() + 48 + ch * stride + 4, 4);
      EXPECT_GT(std::fabs(field), 0.0f) << ch;
      EXPECT_TRUE(std::isfinite(field)) << ch;
      EXPECT_EQ(std::signbit(field), ch < chunks - 2) << "chunk " << ch << " field " << field;
    }
    // Stochastic rounding: one step at most, and unbiased to 2^-9 of a step
    // plus the sampling error of the mean.
    CompressorConfig sc = make(CompressorKind::minmax, bits, kTinyChunk);
    sc.rounding = Rounding::stochastic;
    const int trials = 2000;
    std::vector<double> mean(static_cast<size_t>(n), 0.0);
    for (int t = 0; t < trials; ++t) {
      ExecContext ctx = ExecContext::host();
      ctx.rng = {1234, static_cast<uint64_t>(t) * static_cast<uint64_t>(n)};
      const auto y = decode_vec(encode_vec(x, sc, ctx), n);
      expect_tiny_bound(x, y, bits, 1.0, "stochastic");
      if (HasFatalFailure()) return;
      for (int64_t i = 0; i < n; ++i) mean[static_cast<size_t>(i)] += y[i] / double{trials};
    }
    for (int64_t c0 = 0; c0 < n; c0 += kTinyChunk) {
      const float mn = *std::min_element(x.begin() + c0, x.begin() + c0 + kTinyChunk);
      const float mx = *std::max_element(x.begin() + c0, x.begin() + c0 + kTinyChunk);
      const double step = (static_cast<double>(mx) - mn) / ((1 << bits) - 1);
      for (int64_t i = c0; i < c0 + kTinyChunk; ++i) {
        // Plus the f32 rounding of the decoded values, two ulps.
        const float a = std::fabs(x[i]);
        const double ulp = static_cast<double>(std::nextafter(a, INFINITY)) - a;
        const double tolerance = step / 512 + 6 * step / (2 * std::sqrt(double{trials})) + 2 * ulp;
        ASSERT_NEAR(mean[static_cast<size_t>(i)], x[i], tolerance)
            << "bits " << bits << " element " << i;
      }
    }
  }
}

TEST(MinMax, TopCodeNeverDecodesAboveTheChunkMax) {
  // Ranges where rounding 1 / scale could take min + (2^bits - 1) / scale
  // past max: the encoder raises the scale by ulps, so every chunk decodes
  // into [min, max], whatever its magnitude.
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-140, 120);
  const int64_t n = 4 * 4000;
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t c0 = 0; c0 < n; c0 += 4) {
    const float lo = std::ldexp(mantissa(rng), exponent(rng)) * (rng() % 2 ? 1.0f : -1.0f);
    const float hi = lo + std::ldexp(mantissa(rng), exponent(rng));
    if (!std::isfinite(hi)) continue;
    x[c0] = lo;
    x[c0 + 1] = hi;
    x[c0 + 2] = lo + (hi - lo) / 3;
    x[c0 + 3] = hi;
  }
  for (int bits : {8, 4, 2, 1}) {
    for (Rounding rounding : {Rounding::nearest, Rounding::stochastic}) {
      CompressorConfig c = make(CompressorKind::minmax, bits, 4);
      c.rounding = rounding;
      const auto y = decode_vec(encode_vec(x, c), n);
      for (int64_t c0 = 0; c0 < n; c0 += 4) {
        const float mn = std::min({x[c0], x[c0 + 1], x[c0 + 2]});
        const float mx = std::max({x[c0], x[c0 + 1], x[c0 + 2]});
        for (int64_t i = c0; i < c0 + 4; ++i) {
          ASSERT_GE(y[i], mn) << "bits " << bits << " element " << i;
          ASSERT_LE(y[i], mx) << "bits " << bits << " element " << i << " chunk [" << mn << ", "
                              << mx << "]";
        }
      }
    }
  }
}

TEST(Sign, DecodesToScaledSigns) {
  // Chunks of 1000 (whole bytes of sign bits) and of 1001 (a partial last
  // byte per chunk), with zeros of both signs; plain and accumulating decode.
  for (const auto& [n, chunk] : {std::pair<int64_t, int64_t>{3000, 1000}, {2503, 1001}}) {
    auto x = gaussian(n, 8);
    x[3] = 0.0f;
    x[5] = -0.0f;
    const Encoded e = encode_vec(x, make(CompressorKind::sign, 1, chunk));
    const auto y = decode_vec(e, n);
    std::vector<float> acc(static_cast<size_t>(n), 1.5f);
    decode_accumulate(e.span(), TensorView::host(acc.data(), n), ExecContext::host());
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
      const int64_t c1 = std::min(n, c0 + chunk);
      double sum = 0;
      for (int64_t i = c0; i < c1; ++i) sum += static_cast<double>(x[i]) * x[i];
      const float scale = static_cast<float>(std::sqrt(sum / static_cast<double>(c1 - c0)));
      for (int64_t i = c0; i < c1; ++i) {
        const float want = std::signbit(x[i]) ? -scale : scale;
        ASSERT_EQ(y[i], want) << n << " " << i;
        ASSERT_EQ(acc[i], 1.5f + want) << n << " " << i;
      }
    }
  }
}

TEST(TopK, ExactlyKLargestMagnitudes) {
  ThreadPool pool(2);
  for (int64_t n : {int64_t{10}, int64_t{5000}, int64_t{1} << 18, (int64_t{1} << 20) + 5}) {
    auto x = gaussian(n, 31);
    for (int64_t i = 0; i < n; i += 97) x[i] = 0.5f;  // ties
    for (bool approximate : {false, true}) {
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        CompressorConfig c = make(CompressorKind::topk);
        c.ratio = 0.01;
        c.approximate = approximate;
        const Encoded e = encode_vec(x, c, ExecContext::host(p));
        const PayloadHeader h = read_header(e.span());
        const int64_t k = h.k;
        ASSERT_EQ(k, std::max<int64_t>(1, static_cast<int64_t>(std::ceil(0.01 * n))));
        std::vector<uint32_t> idx(k);
        std::memcpy(idx.data(), e.bytes.data() + 48, k * 4);
        ASSERT_TRUE(std::is_sorted(idx.begin(), idx.end()));
        ASSERT_EQ(std::set<uint32_t>(idx.begin(), idx.end()).size(), static_cast<size_t>(k));
        // Every kept magnitude is >= every dropped one.
        std::vector<char> kept(n, 0);
        float min_kept = INFINITY, max_dropped = 0;
        for (uint32_t i : idx) kept[i] = 1, min_kept = std::min(min_kept, std::fabs(x[i]));
        for (int64_t i = 0; i < n; ++i)
          if (!kept[i]) max_dropped = std::max(max_dropped, std::fabs(x[i]));
        ASSERT_GE(min_kept, max_dropped) << "n " << n << " approximate " << approximate;
        const auto y = decode_vec(e, n);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], kept[i] ? x[i] : 0.0f);
      }
    }
  }
}

TEST(RandomK, SharedSeedSelectsTheSameIndicesWithoutSendingThem) {
  const int64_t n = 100000;
  const auto x = gaussian(n, 41);
  CompressorConfig c = make(CompressorKind::randomk);
  c.ratio = 0.01;
  c.seed = 1234;
  c.step = 5;
  const Encoded e = encode_vec(x, c);
  EXPECT_EQ(e.bytes.size(), 48u + 1000u * 4);  // values only
  const auto y = decode_vec(e, n);
  int64_t nonzero = 0;
  for (int64_t b = 0; b < 1000; ++b) {
    int64_t in_block = 0;
    for (int64_t i = b * 100; i < (b + 1) * 100; ++i)
      if (y[i] != 0.0f) {
        ++in_block;
        EXPECT_EQ(y[i], x[i]);
      }
    EXPECT_EQ(in_block, 1) << "block " << b;  // stratified: one per block
    nonzero += in_block;
  }
  EXPECT_EQ(nonzero, 1000);
  EXPECT_EQ(encode_vec(x, c).bytes, e.bytes);  // reproducible
  c.step = 6;
  EXPECT_NE(encode_vec(x, c).bytes, e.bytes);  // a new step draws anew

  // Rolling stride (CocktailSGD): every 10th element from step mod 10.
  CompressorConfig r = make(CompressorKind::randomk);
  r.random_mode = RandomKMode::rolling;
  r.ratio = 0.1;
  for (uint64_t step : {0, 3, 13}) {
    r.step = step;
    const auto z = decode_vec(encode_vec(x, r), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(z[i], (i % 10 == static_cast<int64_t>(step % 10)) ? x[i] : 0.0f) << i;
  }
}

TEST(Cocktail, RandomThenTopkThenQuantize) {
  const int64_t n = 200000;
  const auto x = gaussian(n, 51);
  CompressorConfig c = make(CompressorKind::cocktail, 4, 128);
  c.ratio = 0.1;
  c.topk_ratio = 0.2;
  c.random_mode = RandomKMode::rolling;
  c.step = 3;
  const Encoded e = encode_vec(x, c);
  const int64_t k = read_header(e.span()).k;
  EXPECT_EQ(k, 4000);
  std::vector<uint32_t> idx(k);
  std::memcpy(idx.data(), e.bytes.data() + 48, k * 4);
  for (uint32_t i : idx) ASSERT_EQ(i % 10, 3u);  // from the rolling selection
  const auto y = decode_vec(e, n);
  // The kept values are the 4-bit quantization of the originals.
  for (uint32_t i : idx) ASSERT_NEAR(y[i], x[i], 0.5);
  EXPECT_GT(compression_ratio(n, c), 40.0);
}

TEST(Cocktail, StridedTopkMatchesTheReferenceSelection) {
  // Random positions step mod stride + j * stride, then exactly the k largest
  // magnitudes among them, ties to the lower index: large enough for the
  // sampled threshold, the AVX2 gather and (with a pool) a split scan.
  ThreadPool pool(2);
  const int64_t n = (int64_t{1} << 21) + 77;
  auto x = gaussian(n, 53);
  // Ties at the k-th largest magnitude (|x| > 1.3 is under 20% of the rest):
  // some are kept, the lower-index ones.
  for (int64_t i = 0; i < n; i += 7) x[i] = (i / 7) % 2 ? 1.3f : -1.3f;
  for (int64_t stride : {1, 10, 30}) {
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      CompressorConfig c = make(CompressorKind::cocktail, 8, 128);
      c.ratio = 1.0 / static_cast<double>(stride);
      c.topk_ratio = 0.2;
      c.random_mode = RandomKMode::rolling;
      c.step = 7;
      const Encoded e = encode_vec(x, c, ExecContext::host(p));
      const int64_t k = read_header(e.span()).k;
      const int64_t offset = 7 % stride, count = (n - offset + stride - 1) / stride;
      std::vector<int64_t> order(static_cast<size_t>(count));
      std::iota(order.begin(), order.end(), 0);
      auto mag = [&](int64_t j) { return std::fabs(x[offset + j * stride]); };
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return mag(a) > mag(b); });
      std::vector<uint32_t> want;
      for (int64_t r = 0; r < k; ++r)
        want.push_back(static_cast<uint32_t>(offset + order[r] * stride));
      std::sort(want.begin(), want.end());
      std::vector<uint32_t> got(static_cast<size_t>(k));
      std::memcpy(got.data(), e.bytes.data() + 48, k * 4);
      ASSERT_EQ(got, want) << "stride " << stride;
    }
  }
  // A stride past what a gather reaches: one element, read in place.
  CompressorConfig c = make(CompressorKind::cocktail, 8, 128);
  c.ratio = 1.0 / 3e8;
  c.random_mode = RandomKMode::rolling;
  c.step = 5;
  const Encoded e = encode_vec(x, c);
  ASSERT_EQ(read_header(e.span()).k, 1);
  uint32_t only = 0;
  std::memcpy(&only, e.bytes.data() + 48, 4);
  EXPECT_EQ(only, 5u);
  // A non-finite element among the selected ones is named by its index.
  x[7 + 10 * 1000] = NAN;
  c.ratio = 0.1;
  c.step = 7;
  std::vector<std::byte> out(encoded_size(n, c));
  try {
    encode(TensorView::host(x.data(), n), out, c, ExecContext::host());
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& err) {
    EXPECT_NE(std::string(err.what()).find("cocktail: element 10007 is nan"), std::string::npos)
        << err.what();
  }
}

// Top-k that keeps the whole random selection sends no index: the body is
// the min-max body of the selected values, in the selection's order, and
// decodes to what randomk selects, quantized as min-max quantizes it.
TEST(Cocktail, WholeRandomSelectionSendsNoIndex) {
  const int64_t n = 100003;
  const auto x = gaussian(n, 57);
  for (auto mode : {RandomKMode::stratified, RandomKMode::rolling}) {
    for (bool by_keep : {false, true}) {
      CompressorConfig c = make(CompressorKind::cocktail, 2, 2048);
      c.ratio = 0.25;
      c.topk_ratio = by_keep ? 0.2 : 1.0;
      c.keep = by_keep ? n : 0;  // keep >= the selection: all of it
      c.random_mode = mode;
      c.seed = 11;
      c.step = 5;
      const Encoded e = encode_vec(x, c);
      const PayloadHeader h = read_header(e.span());
      EXPECT_EQ(h.implicit_stride, mode == RandomKMode::rolling ? 4 : 1);
      CompressorConfig rk = make(CompressorKind::randomk);
      rk.ratio = c.ratio;
      rk.random_mode = mode;
      rk.seed = c.seed;
      rk.step = c.step;
      ASSERT_EQ(h.k, kept_elements(n, rk));
      // The size of a min-max payload of k values: nothing else travels.
      const CompressorConfig values = make(CompressorKind::minmax, 2, 2048);
      EXPECT_EQ(e.bytes.size(), encoded_size(h.k, values));
      // The reference: randomk's positions, then min-max of their values.
      const auto selected = decode_vec(encode_vec(x, rk), n);
      std::vector<float> picked;
      std::vector<int64_t> at;
      for (int64_t i = 0; i < n; ++i)
        if (selected[i] != 0.0f) {
          picked.push_back(x[i]);
          at.push_back(i);
        }
      ASSERT_EQ(static_cast<int64_t>(picked.size()), h.k);
      const auto quantized = decode_vec(encode_vec(picked, values), h.k);
      std::vector<float> want(static_cast<size_t>(n), 0.0f);
      for (size_t j = 0; j < at.size(); ++j) want[at[j]] = quantized[j];
      ASSERT_EQ(decode_vec(e, n), want) << "mode " << static_cast<int>(mode);
      // Its configuration re-encodes it in the same form, byte for byte.
      ASSERT_EQ(encode_vec(x, config_of(h)).bytes, e.bytes) << "mode " << static_cast<int>(mode);
    }
  }
  {  // A rolling selection may be empty (its offset past n): still no index.
    CompressorConfig c = make(CompressorKind::cocktail, 2, 2048);
    c.ratio = 0.25;
    c.topk_ratio = 1.0;
    c.random_mode = RandomKMode::rolling;
    c.step = 3;
    const std::vector<float> y = {1.0f, 2.0f, 3.0f};
    const Encoded e = encode_vec(y, c);
    const PayloadHeader h = read_header(e.span());
    ASSERT_EQ(h.k, 0);
    ASSERT_EQ(h.implicit_stride, 4);
    EXPECT_EQ(encode_vec(y, config_of(h)).bytes, e.bytes);
  }
  // A non-finite selected element is named by its index in the tensor.
  auto z = x;
  z[4001] = NAN;  // stride 4 from step 5 mod 4 = 1
  CompressorConfig nan_config = make(CompressorKind::cocktail, 2, 2048);
  nan_config.ratio = 0.25;
  nan_config.topk_ratio = 1.0;
  nan_config.random_mode = RandomKMode::rolling;
  nan_config.step = 5;
  std::vector<std::byte> nan_out(encoded_size(n, nan_config));
  try {
    encode(TensorView::host(z.data(), n), nan_out, nan_config, ExecContext::host());
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& err) {
    EXPECT_NE(std::string(err.what()).find("cocktail: element 4001 is nan"), std::string::npos)
        << err.what();
  }
  // A rolling stride past the header's 16 bits sends its indices.
  CompressorConfig c = make(CompressorKind::cocktail, 2, 2048);
  c.ratio = 1.0 / 70000;
  c.topk_ratio = 1.0;
  c.random_mode = RandomKMode::rolling;
  const int64_t big = 300000;
  const auto y = gaussian(big, 58);
  const Encoded e = encode_vec(y, c);
  EXPECT_EQ(read_header(e.span()).implicit_stride, 0);
  EXPECT_EQ(read_header(e.span()).k, 5);  // 0, 70000, ..., 280000
  EXPECT_EQ(e.bytes.size(), 5 * 4 + encoded_size(5, make(CompressorKind::minmax, 2, 2048)));
}

TEST(Compressor, DecodeAccumulateAndRequantize) {
  const int64_t n = 5000;
  const auto x = gaussian(n, 61), local = gaussian(n, 62);
  for (CompressorKind kind : kKinds) {
    CompressorConfig c = make(kind, 8, 256);
    c.ratio = 0.05;
    const Encoded e = encode_vec(x, c);
    const auto d = decode_vec(e, n);
    std::vector<float> acc(local);
    decode_accumulate(e.span(), TensorView::host(acc.data(), n), ExecContext::host());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(acc[i], local[i] + d[i]) << compressor_name(kind);
    // requantize_sum: encode(decode(in) + local) with the payload's own configuration.
    std::vector<float> sum(n);
    std::vector<std::byte> out(encoded_size(n, config_of(read_header(e.span()))) + 64);
    const size_t bytes =
        requantize_sum(e.span(), TensorView::host(const_cast<float*>(local.data()), n),
                       TensorView::host(sum.data(), n), out, ExecContext::host());
    std::vector<float> want(n);
    for (int64_t i = 0; i < n; ++i) want[i] = d[i] + local[i];
    EXPECT_EQ(sum, want);
    const PayloadHeader h = read_header(std::span<const std::byte>(out.data(), bytes));
    EXPECT_EQ(h.kind, kind);
    EXPECT_EQ(h.k, read_header(e.span()).k);
  }
}

TEST(ErrorFeedback, RunningSumsTrackWithBoundedResidual) {
  const int64_t n = 4096;
  for (CompressorKind kind : {CompressorKind::minmax, CompressorKind::sign, CompressorKind::topk,
                              CompressorKind::randomk}) {
    CompressorConfig c = make(kind, 2, 512);
    c.ratio = 0.1;
    ErrorFeedback ef(n);
    std::vector<double> sum_in(n, 0.0), sum_out(n, 0.0);
    std::vector<std::byte> payload(encoded_size(n, c));
    for (int step = 0; step < 200; ++step) {
      c.step = static_cast<uint64_t>(step);
      const auto x = gaussian(n, 1000 + step);
      const size_t bytes = ef.compress(TensorView::host(const_cast<float*>(x.data()), n), payload,
                                       c, ExecContext::host());
      std::vector<float> y(n);
      decode(std::span<const std::byte>(payload.data(), bytes), TensorView::host(y.data(), n),
             ExecContext::host());
      for (int64_t i = 0; i < n; ++i) {
        sum_in[i] += x[i];
        sum_out[i] += y[i];
      }
    }
    // sum(decoded) = sum(inputs) - residual, and the residual stays bounded.
    double max_residual = 0;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(sum_out[i], sum_in[i] - ef.residual()[i], 1e-2) << compressor_name(kind);
      max_residual = std::max(max_residual, std::fabs(static_cast<double>(ef.residual()[i])));
    }
    EXPECT_LT(max_residual,
              kind == CompressorKind::topk || kind == CompressorKind::randomk ? 60.0 : 10.0)
        << compressor_name(kind);
  }
}

// ---- hardened decoders -------------------------------------------------------

// Decoding `bytes` into n elements throws CorruptPayload (nothing else) and
// leaves the output untouched. Returns the message.
std::string expect_corrupt(std::vector<std::byte> bytes, int64_t n, const char* what) {
  std::vector<float> out(static_cast<size_t>(std::max<int64_t>(n, 1)), -7.0f);
  for (bool accumulate : {false, true}) {
    try {
      if (accumulate)
        decode_accumulate(bytes, TensorView::host(out.data(), n), ExecContext::host());
      else
        decode(bytes, TensorView::host(out.data(), n), ExecContext::host());
      ADD_FAILURE() << what << ": accepted";
    } catch (const CorruptPayload& e) {
      for (float v : out) EXPECT_EQ(v, -7.0f) << what << ": wrote to the output before throwing";
      if (accumulate) return e.what();
    }
  }
  return {};
}

template <typename T>
void poke(std::vector<std::byte>& b, size_t offset, T value) {
  std::memcpy(b.data() + offset, &value, sizeof(T));
}

TEST(HardenedDecoders, RejectHostilePayloads) {
  const int64_t n = 1000;
  const auto x = gaussian(n, 71);
  const Encoded mm = encode_vec(x, make(CompressorKind::minmax, 8, 256));
  auto b = mm.bytes;
  b.pop_back();
  expect_corrupt(b, n, "truncated");
  b = mm.bytes;
  b.push_back(std::byte{0});
  expect_corrupt(b, n, "too long");
  expect_corrupt(std::vector<std::byte>(mm.bytes.begin(), mm.bytes.begin() + 20), n, "header cut");
  b = mm.bytes;
  poke<uint32_t>(b, 0, 0xdeadbeef);
  expect_corrupt(b, n, "magic");
  b = mm.bytes;
  poke<uint16_t>(b, 4, 99);
  expect_corrupt(b, n, "version");
  b = mm.bytes;
  poke<uint8_t>(b, 6, 42);
  expect_corrupt(b, n, "kind");
  b = mm.bytes;
  poke<uint8_t>(b, 7, 3);
  expect_corrupt(b, n, "bits");
  b = mm.bytes;
  poke<int64_t>(b, 16, -5);
  expect_corrupt(b, n, "negative n");
  b = mm.bytes;
  poke<int64_t>(b, 16, int64_t{1} << 40);
  expect_corrupt(b, n, "huge n");
  b = mm.bytes;
  poke<uint32_t>(b, 12, 0);
  expect_corrupt(b, n, "zero chunk");
  // A negative scale field is a pre-scaled chunk; one whose decoded range
  // overflows is corrupt as any other.
  for (float bad : {NAN, INFINITY, -INFINITY, -1e-45f}) {
    b = mm.bytes;
    poke<float>(b, 48 + 4, bad);
    expect_corrupt(b, n, "scale");
  }
  b = mm.bytes;
  poke<float>(b, 48, NAN);
  expect_corrupt(b, n, "min");

  CompressorConfig tc = make(CompressorKind::topk);
  tc.ratio = 0.01;
  const Encoded tk = encode_vec(x, tc);
  b = tk.bytes;
  poke<uint32_t>(b, 48, 5000);
  expect_corrupt(b, n, "index out of range");
  b = tk.bytes;
  uint32_t first;
  std::memcpy(&first, b.data() + 48, 4);
  poke<uint32_t>(b, 52, first);
  expect_corrupt(b, n, "duplicate index");
  b = tk.bytes;
  poke<int64_t>(b, 24, 11);
  expect_corrupt(b, n, "k vs length");
  b = tk.bytes;
  poke<float>(b, 48 + 10 * 4, INFINITY);
  expect_corrupt(b, n, "non-finite value");

  CompressorConfig rk = make(CompressorKind::randomk);
  rk.random_mode = RandomKMode::rolling;
  rk.ratio = 0.1;
  b = encode_vec(x, rk).bytes;
  poke<uint32_t>(b, 12, 7);
  expect_corrupt(b, n, "rolling stride vs k");

  // cocktail's implicit_stride (header offset 10).
  b = mm.bytes;
  poke<uint16_t>(b, 10, 4);
  EXPECT_NE(expect_corrupt(b, n, "implicit_stride on minmax").find("bad flags"), std::string::npos);
  CompressorConfig cc = make(CompressorKind::cocktail, 2, 64);
  cc.ratio = 0.25;
  cc.topk_ratio = 1.0;
  cc.random_mode = RandomKMode::rolling;
  const Encoded rolling = encode_vec(x, cc);
  b = rolling.bytes;
  poke<uint16_t>(b, 10, 3);
  EXPECT_NE(expect_corrupt(b, n, "implicit stride vs k").find("implicit rolling stride 3"),
            std::string::npos);
  b = rolling.bytes;
  poke<uint16_t>(b, 10, 0);
  expect_corrupt(b, n, "indices expected, none sent");
  cc.random_mode = RandomKMode::stratified;
  b = encode_vec(x, cc).bytes;
  poke<uint16_t>(b, 10, 2);
  EXPECT_NE(expect_corrupt(b, n, "stratified implicit stride").find("expected 0 or 1"),
            std::string::npos);
}

TEST(HardenedDecoders, RandomCorruptionNeverEscapes) {
  // Flip bytes of valid payloads of every kind: the decoder either succeeds
  // or throws a relaxcc error; libFuzzer (fuzz/) explores far more.
  std::mt19937 rng(99);
  const int64_t n = 700;
  const auto x = gaussian(n, 81);
  for (CompressorKind kind : kKinds) {
    CompressorConfig c = make(kind, 4, 64);
    c.ratio = 0.05;
    const Encoded e = encode_vec(x, c);
    for (int trial = 0; trial < 2000; ++trial) {
      auto b = e.bytes;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) b[rng() % b.size()] = static_cast<std::byte>(rng());
      if (rng() % 8 == 0) b.resize(rng() % (b.size() + 1));
      std::vector<float> out(n);
      try {
        decode(b, TensorView::host(out.data(), n), ExecContext::host());
      } catch (const Error&) {
      }
    }
  }
}

// ---- decoder contract: finite outputs, CorruptPayload, config ranges ---------

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

float peek_f32(const std::vector<std::byte>& b, size_t offset) {
  float v;
  std::memcpy(&v, b.data() + offset, 4);
  return v;
}

// The decoder contract's test of a min-max chunk, from compressor.h: both
// finite, and min + ((2^bits - 1) * (1 / |scale|)) * d finite (d = 2^-100
// for a pre-scaled chunk, a negative scale field, else 1).
bool chunk_decodes_finite(float min, float scale, int bits) {
  if (!std::isfinite(min) || !std::isfinite(scale)) return false;
  const float s = std::fabs(scale);
  const float inv = s > 0.0f ? 1.0f / s : 0.0f;
  const float d = std::signbit(scale) ? 0x1p-100f : 1.0f;
  return std::isfinite(min + (static_cast<float>((1 << bits) - 1) * inv) * d);
}

// Chunks of 256 spanning [-1.5, -1.5 + range]: min = -1.5 (exponent 127, so
// flipping bit 30 of min makes it Inf or NaN), and a range for which the
// scale is >= 2 (bit 30 set) and clearing bit 30 makes (2^bits - 1) / scale
// overflow: 1.25 for 8, 4 and 2 bits (scale 204, 12, 2.4), 0.45 for 1 bit
// (scale 2.22, which turns into a subnormal of 1.3e-39).
std::vector<float> minmax_ramp(int bits, int64_t n) {
  const float range = bits == 1 ? 0.45f : 1.25f;
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[i] = -1.5f + range * static_cast<float>(i % 256) / 255.0f;
  return x;
}

TEST(DecoderContract, FlippedScaleBitThatOverflowsTheRangeIsCorrupt) {
  // The reported case: one flipped bit turned a chunk's scale from 39.1 into
  // 1.15e-37, and decoding wrote 254 Infs. Chunk 1's scale sits at byte
  // 48 + (8 + 256 * bits / 8) + 4.
  const int64_t n = 768;
  for (int bits : {8, 4, 2, 1}) {
    const auto x = minmax_ramp(bits, n);
    const Encoded e = encode_vec(x, make(CompressorKind::minmax, bits, 256));
    const size_t stride = 8 + 256 * bits / 8;
    const size_t scale_at = 48 + stride + 4;
    const float scale = peek_f32(e.bytes, scale_at);
    ASSERT_GE(scale, 2.0f)
        << bits;  // bit 30 set: clearing it divides by 2^128 or makes a subnormal
    auto b = e.bytes;
    b[scale_at + 3] ^= std::byte{0x40};  // bit 30 of the little-endian f32
    const float flipped = peek_f32(b, scale_at);
    ASSERT_FALSE(chunk_decodes_finite(-1.5f, flipped, bits)) << bits << " " << flipped;
    const std::string msg = expect_corrupt(b, n, "flipped scale bit");
    EXPECT_TRUE(contains(msg, "minmax payload: chunk 1 ")) << msg;
    EXPECT_TRUE(contains(msg, "decodes up to")) << msg;
    EXPECT_TRUE(contains(msg, "inf")) << msg;
    EXPECT_TRUE(contains(msg, "expected a finite decoded range")) << msg;

    // Bit 30 of chunk 2's min: -1.5 becomes NaN.
    b = e.bytes;
    const size_t min_at = 48 + 2 * stride;
    ASSERT_EQ(peek_f32(b, min_at), -1.5f);
    b[min_at + 3] ^= std::byte{0x40};
    const std::string min_msg = expect_corrupt(b, n, "flipped min bit");
    EXPECT_TRUE(contains(min_msg, "minmax payload: chunk 2 has min -nan and scale ")) << min_msg;
    EXPECT_TRUE(contains(min_msg, "(expected both finite)")) << min_msg;

    // A min so large that min + (2^bits - 1) / scale overflows.
    b = e.bytes;
    poke<float>(b, 48, 3.4e38f);
    poke<float>(b, 52, static_cast<float>((1 << bits) - 1) / 1e36f);
    const std::string top_msg = expect_corrupt(b, n, "min near FLT_MAX");
    EXPECT_TRUE(contains(top_msg, "minmax payload: chunk 0 ")) << top_msg;
  }
}

TEST(DecoderContract, EverySingleBitFlipOfMinOrScaleIsCorruptOrFinite) {
  // All 64 single-bit flips of chunk 1's min and scale, for each width: the
  // decoder throws CorruptPayload exactly when the contract's test says the
  // chunk cannot decode to finite values, and writes only finite values
  // otherwise.
  const int64_t n = 768;
  for (int bits : {8, 4, 2, 1}) {
    const auto x = minmax_ramp(bits, n);
    const Encoded e = encode_vec(x, make(CompressorKind::minmax, bits, 256));
    const size_t field0 = 48 + (8 + 256 * bits / 8);
    int corrupt = 0;
    for (size_t bit = 0; bit < 64; ++bit) {
      auto b = e.bytes;
      b[field0 + bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
      const bool want_corrupt =
          !chunk_decodes_finite(peek_f32(b, field0), peek_f32(b, field0 + 4), bits);
      std::vector<float> out(n);
      try {
        decode(b, TensorView::host(out.data(), n), ExecContext::host());
        EXPECT_FALSE(want_corrupt) << "bits " << bits << " flip " << bit << ": accepted";
        for (int64_t i = 0; i < n; ++i)
          ASSERT_TRUE(std::isfinite(out[i])) << bits << " flip " << bit << " i " << i;
      } catch (const CorruptPayload&) {
        EXPECT_TRUE(want_corrupt) << "bits " << bits << " flip " << bit << ": rejected";
        ++corrupt;
      }
    }
    EXPECT_GE(corrupt, 2) << bits;  // at least the min's and the scale's bit 30
  }
}

TEST(DecoderContract, RandomByteOverwritesThrowCorruptPayloadOrDecodeFinite) {
  // Single random bytes overwritten anywhere in valid payloads of every
  // kind (and every width of the quantizing kinds): decode and
  // decode_accumulate either throw CorruptPayload, writing nothing, or
  // write only finite values. A report saw 3 Infs in 3000 of these.
  std::mt19937 rng(2024);
  const int64_t n = 1000;
  const auto x = gaussian(n, 17, 4.0f);
  int64_t decoded = 0, corrupt = 0;
  for (CompressorKind kind : kKinds) {
    const bool quantizes = kind == CompressorKind::minmax || kind == CompressorKind::cocktail;
    for (int bits : {8, 4, 2, 1}) {
      if (!quantizes && bits != 8) continue;
      CompressorConfig c = make(kind, bits, quantizes ? 64 : 128);
      c.ratio = 0.2;
      const Encoded e = encode_vec(x, c);
      for (int trial = 0; trial < 3000; ++trial) {
        auto b = e.bytes;
        const size_t at = rng() % b.size();
        b[at] = static_cast<std::byte>((static_cast<unsigned>(b[at]) + 1 + rng() % 255) %
                                       256);  // a different byte
        std::vector<float> out(n, -7.0f), acc(n, 0.0f);
        try {
          decode(b, TensorView::host(out.data(), n), ExecContext::host());
        } catch (const CorruptPayload&) {
          for (int64_t i = 0; i < n; ++i)
            ASSERT_EQ(out[i], -7.0f) << compressor_name(kind) << " byte " << at;
          ++corrupt;
          continue;
        }
        ++decoded;
        for (int64_t i = 0; i < n; ++i)
          ASSERT_TRUE(std::isfinite(out[i]))
              << compressor_name(kind) << " bits " << bits << " byte " << at << " element " << i
              << " = " << out[i];
        decode_accumulate(b, TensorView::host(acc.data(), n), ExecContext::host());
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(acc[i], out[i]) << compressor_name(kind) << " byte " << at;
      }
    }
  }
  // Both outcomes occur (most overwrites land in codes or values).
  EXPECT_GT(decoded, 0);
  EXPECT_GT(corrupt, 0);
}

TEST(DecoderContract, HalfPayloadsWithInfOrNanBitsAreCorrupt) {
  const int64_t n = 100;
  const auto x = gaussian(n, 5);
  for (CompressorKind kind : {CompressorKind::f16, CompressorKind::bf16}) {
    const Encoded e = encode_vec(x, make(kind));
    const std::vector<uint16_t> bad =
        kind == CompressorKind::f16 ? std::vector<uint16_t>{0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xffff}
                                    : std::vector<uint16_t>{0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffff};
    for (uint16_t bits : bad) {
      auto b = e.bytes;
      poke<uint16_t>(b, 48 + 2 * 37, bits);
      const std::string msg = expect_corrupt(b, n, "inf/nan bits");
      EXPECT_TRUE(
          contains(msg, std::string(compressor_name(kind)) + " payload: element 37 has bits 0x"))
          << msg;
      EXPECT_TRUE(contains(msg, "an Inf or NaN")) << msg;
    }
    // The largest finite values decode exactly.
    auto b = e.bytes;
    const uint16_t max_bits = kind == CompressorKind::f16 ? 0x7bff : 0x7f7f;
    poke<uint16_t>(b, 48, max_bits);
    poke<uint16_t>(b, 50, static_cast<uint16_t>(max_bits | 0x8000));
    const auto y = decode_vec(Encoded{b}, n);
    EXPECT_EQ(y[0], kind == CompressorKind::f16 ? 65504.0f : bf16_bits_to_f32(0x7f7f));
    EXPECT_EQ(y[1], -y[0]);
  }
}

TEST(EncoderContract, ValuesTheKindCannotRepresentAreRefused) {
  // f16: 65504 is the largest finite value; 65519 still rounds to it, 65520
  // rounds to Inf, so encode refuses it, naming the element.
  std::vector<float> x(50, 1.0f);
  x[10] = 65504.0f;
  x[11] = -65519.0f;
  EXPECT_EQ(decode_vec(encode_vec(x, make(CompressorKind::f16)), 50)[11], -65504.0f);
  x[12] = 65520.0f;
  try {
    encode_vec(x, make(CompressorKind::f16));
    ADD_FAILURE() << "f16 accepted 65520";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(
        contains(e.what(), "f16: element 12 is 65520, which overflows f16 (largest finite 65504)"))
        << e.what();
  }
  // bf16: FLT_MAX rounds to Inf; the largest value that does not is kept.
  std::vector<float> y(20, 1.0f);
  y[3] = bf16_bits_to_f32(0x7f7f);
  EXPECT_EQ(decode_vec(encode_vec(y, make(CompressorKind::bf16)), 20)[3], y[3]);
  y[4] = -std::numeric_limits<float>::max();
  try {
    encode_vec(y, make(CompressorKind::bf16));
    ADD_FAILURE() << "bf16 accepted -FLT_MAX";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(contains(e.what(), "bf16: element 4 is ")) << e.what();
    EXPECT_TRUE(contains(e.what(), "which overflows bf16")) << e.what();
  }
  // minmax: a chunk whose max - min overflows f32 is refused, naming it.
  std::vector<float> z(300, 0.0f);
  z[200] = -3e38f;
  z[201] = 3e38f;
  try {
    encode_vec(z, make(CompressorKind::minmax, 8, 128));
    ADD_FAILURE() << "minmax accepted a range wider than f32";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(
        contains(e.what(), "minmax encode: chunk 1 (elements from 128) spans [-3e+38, 3e+38]"))
        << e.what();
  }
}

TEST(EncoderContract, ExtremeFiniteChunksDecodeFinite) {
  // Chunks reaching to FLT_MAX: where rounding would take min + (2^bits - 1)
  // / scale past FLT_MAX, the encoder raises the scale by ulps, so what it
  // writes always decodes, to finite values within a step of the input.
  const float big = std::numeric_limits<float>::max();
  for (int bits : {8, 4, 2, 1}) {
    for (float lo : {0.0f, 1.0f, 1e37f, big * 0.5f, std::nextafter(big, 0.0f)}) {
      std::vector<float> x = {lo, big, lo / 2 + big / 2, big};
      const Encoded e = encode_vec(x, make(CompressorKind::minmax, bits, 4));
      const float scale = peek_f32(e.bytes, 52);
      EXPECT_TRUE(chunk_decodes_finite(lo, scale, bits)) << bits << " " << lo;
      const auto y = decode_vec(e, 4);
      const double step = (static_cast<double>(big) - lo) / ((1 << bits) - 1);
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_TRUE(std::isfinite(y[i])) << bits << " " << lo << " " << i;
        EXPECT_LE(std::fabs(static_cast<double>(y[i]) - x[i]), step * 0.5 + 1e32)
            << bits << " " << lo << " " << i;
      }
    }
  }
}

TEST(DecoderContract, SparseElementCountDisagreementIsCorrupt) {
  // The body of a sparse payload does not depend on n, so a corrupt n
  // passes the size check: it disagrees with the output and is
  // CorruptPayload (it was InvalidArgument).
  const int64_t n = 1000;
  const auto x = gaussian(n, 23);
  for (CompressorKind kind :
       {CompressorKind::topk, CompressorKind::randomk, CompressorKind::cocktail}) {
    CompressorConfig c = make(kind, 4, 64);
    c.ratio = 0.1;
    const Encoded e = encode_vec(x, c);
    for (int64_t corrupt_n : {n + 1, n - 1, n * 2}) {
      auto b = e.bytes;
      poke<int64_t>(b, 16, corrupt_n);
      if (kind == CompressorKind::randomk) {
        // randomk recomputes k from n: the header is still self-consistent
        // only where k stays the same; otherwise the size check catches it.
        std::vector<float> out(n);
        EXPECT_THROW(decode(b, TensorView::host(out.data(), n), ExecContext::host()),
                     CorruptPayload);
        continue;
      }
      const std::string msg = expect_corrupt(b, n, "element count");
      EXPECT_TRUE(contains(
          msg, std::string(compressor_name(kind)) + " payload: element count vs the output's"))
          << msg;
      EXPECT_TRUE(contains(msg, "got " + std::to_string(corrupt_n) + " vs 1000")) << msg;
      // requantize_sum: the local tensor, too, is the caller's.
      std::vector<float> local(n, 0.0f), acc(n);
      std::vector<std::byte> out(encoded_size(n, c) + 64);
      EXPECT_THROW(requantize_sum(b, TensorView::host(local.data(), n),
                                  TensorView::host(acc.data(), n), out, ExecContext::host()),
                   CorruptPayload);
    }
    // A corrupt k: the size no longer matches.
    auto b = e.bytes;
    poke<int64_t>(b, 24, read_header(e.span()).k + 1);
    EXPECT_TRUE(contains(expect_corrupt(b, n, "k"), "size")) << compressor_name(kind);
  }
  // A non-finite sparse value is refused before the output is zeroed.
  CompressorConfig tc = make(CompressorKind::topk);
  tc.ratio = 0.05;
  auto b = encode_vec(x, tc).bytes;
  poke<float>(b, 48 + 50 * 4 + 7 * 4, NAN);
  EXPECT_TRUE(contains(expect_corrupt(b, n, "nan value"), "topk payload: value 7 is nan"));
}

// validate() throws InvalidArgument whose message names the field, the
// valid range and the value got.
void expect_invalid(const CompressorConfig& c, const std::string& field, const std::string& range,
                    const std::string& got) {
  SCOPED_TRACE(field + " " + got);
  try {
    c.validate();
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_TRUE(
        contains(e.what(), "CompressorConfig." + field + " must be " + range + ", got " + got))
        << e.what();
  }
  // encode() and encoded_size() validate too.
  EXPECT_THROW(encoded_size(10, c), InvalidArgument);
  std::vector<float> x(10, 1.0f);
  std::vector<std::byte> out(4096);
  EXPECT_THROW(encode(TensorView::host(x.data(), 10), out, c, ExecContext::host()),
               InvalidArgument);
}

TEST(CompressorConfigRanges, OutOfRangeFieldsAreInvalidArgument) {
  CompressorConfig c;
  c.kind = static_cast<CompressorKind>(0);
  expect_invalid(c, "kind", "one of f16 (1), bf16, minmax, sign, topk, randomk, cocktail (7)", "0");
  c.kind = static_cast<CompressorKind>(8);
  expect_invalid(c, "kind", "one of f16 (1), bf16, minmax, sign, topk, randomk, cocktail (7)", "8");
  for (CompressorKind kind : {CompressorKind::minmax, CompressorKind::cocktail}) {
    for (int bits : {0, 3, 16, -8}) {
      c = make(kind, bits, 64);
      expect_invalid(c, "bits", "8, 4, 2 or 1", std::to_string(bits));
    }
  }
  for (CompressorKind kind :
       {CompressorKind::minmax, CompressorKind::sign, CompressorKind::cocktail}) {
    for (int64_t chunk : {int64_t{0}, int64_t{-1}, (int64_t{1} << 30) + 1}) {
      c = make(kind, 8, chunk);
      expect_invalid(c, "chunk", "in [1, 2^30]", std::to_string(chunk));
    }
  }
  for (CompressorKind kind :
       {CompressorKind::topk, CompressorKind::randomk, CompressorKind::cocktail}) {
    for (auto [ratio, text] : {std::pair<double, std::string>{0.0, "0"},
                               {-0.5, "-0.5"},
                               {1.5, "1.5"},
                               {std::nan(""), "nan"}}) {
      c = make(kind, 8, 64);
      c.ratio = ratio;
      expect_invalid(c, "ratio", "in (0, 1]", text);
    }
    c = make(kind, 8, 64);
    c.keep = -3;
    expect_invalid(c, "keep", ">= 0", "-3");
  }
  for (CompressorKind kind : {CompressorKind::randomk, CompressorKind::cocktail}) {
    c = make(kind, 8, 64);
    c.random_mode = RandomKMode::rolling;
    c.ratio = 1e-10;
    expect_invalid(c, "ratio", "in [2^-30, 1] with random_mode rolling (a stride of at most 2^30)",
                   "1e-10");
  }
  for (double topk_ratio : {0.0, 2.0}) {
    c = make(CompressorKind::cocktail, 8, 64);
    c.topk_ratio = topk_ratio;
    expect_invalid(c, "topk_ratio", "in (0, 1]", topk_ratio == 0.0 ? "0" : "2");
  }
  for (CompressorKind kind : kKinds) {
    c = make(kind, 8, 64);
    c.rounding = static_cast<Rounding>(2);
    expect_invalid(c, "rounding", "nearest (0) or stochastic (1)", "2");
    c = make(kind, 8, 64);
    c.random_mode = static_cast<RandomKMode>(5);
    expect_invalid(c, "random_mode", "stratified (0) or rolling (1)", "5");
  }
}

TEST(CompressorConfigRanges, BoundaryValuesAreAccepted) {
  for (CompressorKind kind : kKinds) {
    for (int bits : {8, 4, 2, 1}) {
      CompressorConfig c = make(kind, bits, int64_t{1} << 30);
      c.ratio = 1.0;
      c.topk_ratio = 1.0;
      c.keep = 0;
      EXPECT_NO_THROW(c.validate()) << compressor_name(kind);
      c.chunk = 1;
      c.random_mode = RandomKMode::rolling;
      c.ratio = 1.0 / static_cast<double>(1 << 30);
      EXPECT_NO_THROW(c.validate()) << compressor_name(kind);
    }
  }
  // Fields a kind does not read are not checked.
  CompressorConfig c = make(CompressorKind::f16, 3, 0);
  c.ratio = 7.0;
  c.keep = -1;
  c.topk_ratio = -1.0;
  EXPECT_NO_THROW(c.validate());
}

// ---- GPU --------------------------------------------------------------------

TEST(CompressorGpu, MatchesCpuBitForBit) {
  const auto cuda = cuda_availability();
  if (cuda.device_count == 0) GTEST_SKIP() << "no GPU: " << cuda.reason;
  ExecContext gpu;
  gpu.device = Device::cuda(0);
  gpu.rng = {77, 1000};
  ExecContext cpu = ExecContext::host();
  cpu.rng = gpu.rng;
  const int64_t n = 100003;
  const auto x = gaussian(n, 91, 2.0f);
  test::GpuBuffer dx(x.data(), n * 4);
  for (CompressorKind kind : {CompressorKind::f16, CompressorKind::bf16, CompressorKind::minmax,
                              CompressorKind::randomk}) {
    for (int bits : {8, 4, 2, 1}) {
      for (Rounding rounding : {Rounding::nearest, Rounding::stochastic}) {
        CompressorConfig c = make(kind, bits, 1000);
        c.rounding = rounding;
        c.ratio = 0.02;
        c.seed = 5;
        c.step = 9;
        const size_t size = encoded_size(n, c);
        std::vector<std::byte> want(size), got(size);
        encode(TensorView::host(const_cast<float*>(x.data()), n), want, c, cpu);
        test::GpuBuffer payload(nullptr, size);
        encode(TensorView(dx.get(), n, DType::f32, gpu.device),
               std::span<std::byte>(static_cast<std::byte*>(payload.get()), size), c, gpu);
        payload.copy_to_host(got.data());
        ASSERT_EQ(got, want) << compressor_name(kind) << " bits " << bits << " sr "
                             << int(rounding);
        // Device decode of the payload equals host decode.
        test::GpuBuffer dy(nullptr, n * 4);
        decode(std::span<const std::byte>(static_cast<const std::byte*>(payload.get()), size),
               TensorView(dy.get(), n, DType::f32, gpu.device), gpu);
        std::vector<float> y_gpu(n), y_cpu(n);
        dy.copy_to_host(y_gpu.data());
        decode(want, TensorView::host(y_cpu.data(), n), cpu);
        ASSERT_EQ(std::memcmp(y_gpu.data(), y_cpu.data(), n * 4), 0) << compressor_name(kind);
        if (kind != CompressorKind::minmax) break;
      }
      if (kind != CompressorKind::minmax) break;
    }
  }
  // Pre-scaled chunks (ranges below 2^-100) and the scale raised until the
  // top code decodes within max: the same payloads and values on the device.
  {
    const std::vector<float> tiny = tiny_chunks();
    const auto tn = static_cast<int64_t>(tiny.size());
    test::GpuBuffer dt(tiny.data(), tn * 4);
    for (int bits : {8, 4, 2, 1}) {
      for (Rounding rounding : {Rounding::nearest, Rounding::stochastic}) {
        CompressorConfig c = make(CompressorKind::minmax, bits, kTinyChunk);
        c.rounding = rounding;
        const size_t size = encoded_size(tn, c);
        std::vector<std::byte> want(size), got(size);
        encode(TensorView::host(const_cast<float*>(tiny.data()), tn), want, c, cpu);
        test::GpuBuffer payload(nullptr, size);
        encode(TensorView(dt.get(), tn, DType::f32, gpu.device),
               std::span<std::byte>(static_cast<std::byte*>(payload.get()), size), c, gpu);
        payload.copy_to_host(got.data());
        ASSERT_EQ(got, want) << "tiny ranges, bits " << bits << " sr " << int(rounding);
        test::GpuBuffer dy(nullptr, tn * 4);
        decode(std::span<const std::byte>(static_cast<const std::byte*>(payload.get()), size),
               TensorView(dy.get(), tn, DType::f32, gpu.device), gpu);
        std::vector<float> y_gpu(static_cast<size_t>(tn)), y_cpu(static_cast<size_t>(tn));
        dy.copy_to_host(y_gpu.data());
        decode(want, TensorView::host(y_cpu.data(), tn), cpu);
        ASSERT_EQ(std::memcmp(y_gpu.data(), y_cpu.data(), static_cast<size_t>(tn) * 4), 0)
            << "tiny ranges, bits " << bits;
      }
    }
  }
  // Top-k: host selection, device gather; then the device scatter,
  // validated on the device.
  CompressorConfig tc = make(CompressorKind::topk);
  tc.ratio = 0.01;
  std::vector<std::byte> tk(encoded_size(n, tc)), tk_gpu(tk.size());
  encode(TensorView::host(const_cast<float*>(x.data()), n), tk, tc, cpu);
  {
    test::GpuBuffer payload(nullptr, tk.size());
    encode(TensorView(dx.get(), n, DType::f32, gpu.device),
           std::span<std::byte>(static_cast<std::byte*>(payload.get()), tk.size()), tc, gpu);
    payload.copy_to_host(tk_gpu.data());
    EXPECT_EQ(tk_gpu, tk);
  }
  test::GpuBuffer dp(tk.data(), tk.size()), dy(nullptr, n * 4);
  decode(std::span<const std::byte>(static_cast<const std::byte*>(dp.get()), tk.size()),
         TensorView(dy.get(), n, DType::f32, gpu.device), gpu);
  std::vector<float> y_gpu(n), y_cpu(n);
  dy.copy_to_host(y_gpu.data());
  decode(tk, TensorView::host(y_cpu.data(), n), cpu);
  EXPECT_EQ(std::memcmp(y_gpu.data(), y_cpu.data(), n * 4), 0);
  // cocktail payloads (encoded on the host), indices sent or implicit: the
  // device decode equals the host's.
  for (double topk_ratio : {0.2, 1.0}) {
    for (auto mode : {RandomKMode::stratified, RandomKMode::rolling}) {
      CompressorConfig cc = make(CompressorKind::cocktail, 2, 128);
      cc.ratio = 0.25;
      cc.topk_ratio = topk_ratio;
      cc.random_mode = mode;
      cc.seed = 5;
      cc.step = 9;
      std::vector<std::byte> p(encoded_size(n, cc));
      encode(TensorView::host(const_cast<float*>(x.data()), n), p, cc, cpu);
      test::GpuBuffer dpc(p.data(), p.size());
      decode(std::span<const std::byte>(static_cast<const std::byte*>(dpc.get()), p.size()),
             TensorView(dy.get(), n, DType::f32, gpu.device), gpu);
      dy.copy_to_host(y_gpu.data());
      decode(p, TensorView::host(y_cpu.data(), n), cpu);
      EXPECT_EQ(std::memcmp(y_gpu.data(), y_cpu.data(), n * 4), 0)
          << "cocktail top-k " << topk_ratio << " mode " << static_cast<int>(mode);
    }
  }
  // A hostile index is caught on the device.
  poke<uint32_t>(tk, 48, static_cast<uint32_t>(n + 5));
  test::GpuBuffer bad(tk.data(), tk.size());
  EXPECT_THROW(
      decode(std::span<const std::byte>(static_cast<const std::byte*>(bad.get()), tk.size()),
             TensorView(dy.get(), n, DType::f32, gpu.device), gpu),
      CorruptPayload);
}

}  // namespace
}  // namespace relaxcc::kernels
