#include "relaxcc/kernels/chunk_topk.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "relaxcc/errors.h"

namespace relaxcc::kernels {
namespace {

std::vector<float> wave(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i)) * (1 + i % 7);
  return x;
}

std::vector<float> round_trip(const std::vector<float>& x, const ChunkTopkConfig& c,
                              size_t* bytes = nullptr) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<std::byte> p(chunk_topk_encoded_size(n, c));
  std::vector<float> in = x;
  const size_t written =
      chunk_topk_encode(TensorView::host(in.data(), n), p, c, ExecContext::host());
  EXPECT_EQ(written, p.size());
  if (bytes != nullptr) *bytes = written;
  std::vector<float> out(x.size(), 7.0f);
  chunk_topk_decode(p, TensorView::host(out.data(), n), false, ExecContext::host());
  return out;
}

TEST(ChunkTopk, KeepsEachChunksLargestAtEightBitsWithinHalfAStep) {
  ChunkTopkConfig c;
  c.chunk = 64;
  c.ratio = 0.03;  // 2 of 64
  c.bits = 8;
  c.group = 1000;
  const std::vector<float> x = wave(64 * 10 + 5);
  EXPECT_EQ(chunk_topk_per_chunk(c), 2);
  EXPECT_EQ(chunk_topk_kept(static_cast<int64_t>(x.size()), c), 10 * 2 + 2);
  const std::vector<float> y = round_trip(x, c);
  float lo = 0, hi = 0;
  for (float v : x) lo = std::min(lo, v), hi = std::max(hi, v);
  const float step = (hi - lo) / 255;
  for (size_t first = 0; first < x.size(); first += 64) {
    const size_t end = std::min(x.size(), first + 64);
    // The two kept are the chunk's two largest |x|; the others decode to 0.
    std::vector<size_t> order;
    for (size_t i = first; i < end; ++i) order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
    for (size_t j = 0; j < order.size(); ++j) {
      const size_t i = order[j];
      if (j < 2) {
        EXPECT_NEAR(y[i], x[i], 0.5f * step + 1e-6f) << i;
      } else {
        EXPECT_EQ(y[i], 0.0f) << i;
      }
    }
  }
}

TEST(ChunkTopk, TwoBitPayloadIsAboutNinetyEightTimesSmallerThanF32) {
  ChunkTopkConfig c;  // SparseLoCo's: 64-element chunks, 2 of 64, 2 bits
  const int64_t n = 64 * 4096;
  size_t bytes = 0;
  const std::vector<float> y = round_trip(wave(n), c, &bytes);
  // 8192 kept: 8192 index bytes, 2048 code bytes, 64 groups of 8 bytes, 88
  // header bytes.
  EXPECT_EQ(bytes, 40u + 8192u + 48u + 64u * (8u + 32u));
  EXPECT_GT(4.0 * n / static_cast<double>(bytes), 95.0);
  int64_t nonzero = 0;
  for (float v : y) nonzero += v != 0.0f;
  EXPECT_LE(nonzero, 8192);
}

TEST(ChunkTopk, AccumulateAddsAndLongChunksUseTwoByteIndices) {
  ChunkTopkConfig c;
  c.chunk = 1000;
  c.ratio = 0.5;
  c.bits = 4;
  const std::vector<float> x = wave(2500);
  const std::vector<float> y = round_trip(x, c);
  std::vector<std::byte> p(chunk_topk_encoded_size(2500, c));
  std::vector<float> in = x;
  chunk_topk_encode(TensorView::host(in.data(), 2500), p, c, ExecContext::host());
  std::vector<float> acc(2500, 1.0f);
  chunk_topk_decode(p, TensorView::host(acc.data(), 2500), true, ExecContext::host());
  for (size_t i = 0; i < acc.size(); ++i) EXPECT_EQ(acc[i], 1.0f + y[i]) << i;
  // 1500 kept (500 of each chunk, the last one full too), 2 index bytes each
  // above 256 elements per chunk, 12 groups of 4-bit codes.
  EXPECT_EQ(chunk_topk_kept(2500, c), 1500);
  EXPECT_EQ(p.size(), sizeof(ChunkTopkHeader) + 2 * 1500u + 48u + 12u * 8u + 750u);
}

TEST(ChunkTopk, BadConfigurationIsInvalidArgument) {
  std::vector<float> x = wave(10);
  std::vector<std::byte> p(4096);
  const auto refuses = [&](ChunkTopkConfig c, const char* what) {
    try {
      chunk_topk_encode(TensorView::host(x.data(), 10), p, c, ExecContext::host());
      ADD_FAILURE() << "accepted " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  ChunkTopkConfig c;
  c.chunk = 0;
  refuses(c, "chunk must be in [1, 65536], got 0");
  c = {};
  c.ratio = 0;
  refuses(c, "ratio");
  c.ratio = 1.5;
  refuses(c, "ratio");
  c = {};
  c.bits = 3;
  refuses(c, "bits");
  c = {};
  c.group = 0;
  refuses(c, "group");
  x[3] = NAN;
  refuses({}, "element 3");
}

TEST(ChunkTopk, CorruptPayloadsAreRefusedWithoutWriting) {
  ChunkTopkConfig c;
  c.chunk = 16;
  c.ratio = 0.25;
  const int64_t n = 100;
  std::vector<float> x = wave(n);
  std::vector<std::byte> good(chunk_topk_encoded_size(n, c));
  chunk_topk_encode(TensorView::host(x.data(), n), good, c, ExecContext::host());
  const auto refused = [&](std::vector<std::byte> p, int64_t count) {
    std::vector<float> out(static_cast<size_t>(count), 3.0f);
    EXPECT_THROW(
        chunk_topk_decode(p, TensorView::host(out.data(), count), false, ExecContext::host()),
        CorruptPayload);
    for (float v : out) EXPECT_EQ(v, 3.0f);
  };
  refused(good, n + 1);  // another element count
  std::vector<std::byte> p = good;
  p.pop_back();
  refused(p, n);  // short
  p = good;
  p[0] ^= std::byte{1};
  refused(p, n);  // magic
  p = good;
  p[sizeof(ChunkTopkHeader)] = std::byte{16};  // an index past its chunk
  refused(p, n);
  p = good;
  p[sizeof(ChunkTopkHeader) + 1] = p[sizeof(ChunkTopkHeader)];  // not increasing
  refused(p, n);
  p = good;
  const float inf = INFINITY;  // the first group's min
  std::memcpy(p.data() + sizeof(ChunkTopkHeader) + 28 + 48, &inf, 4);
  refused(p, n);
}

}  // namespace
}  // namespace relaxcc::kernels
