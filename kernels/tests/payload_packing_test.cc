// Payload packing: lossless round trips, what it saves on skewed codes, and
// a hardened unpack (every corruption gives CorruptPayload).
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>
#include <zstd.h>

#include "relaxcc/errors.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/kernels/payload_packing.h"

namespace relaxcc::kernels {
namespace {

// A 2-bit min-max payload of normal data, chunks of 2048.
std::vector<std::byte> minmax_payload(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = d(rng);
  CompressorConfig c;
  c.kind = CompressorKind::minmax;
  c.bits = 2;
  c.chunk = 2048;
  std::vector<std::byte> payload(encoded_size(n, c));
  encode(TensorView::host(x.data(), n), payload, c, ExecContext::host());
  return payload;
}

std::vector<std::byte> pack(std::span<const std::byte> raw) {
  std::vector<std::byte> out(packed_bound(raw.size()));
  out.resize(pack_payload(raw, out));
  return out;
}

TEST(PayloadPacking, RoundTripsByteForByte) {
  for (int64_t n : {0, 1, 5, 2048, 100000}) {
    const std::vector<std::byte> raw = minmax_payload(n, static_cast<uint32_t>(n));
    const std::vector<std::byte> packed = pack(raw);
    ASSERT_EQ(unpacked_size(packed), raw.size()) << n;
    std::vector<std::byte> back(raw.size());
    unpack_payload(packed, back);
    EXPECT_EQ(back, raw) << n;
  }
  // Bytes that do not compress round-trip too, within packed_bound.
  std::vector<std::byte> noise(70000);
  std::mt19937 rng(7);
  for (std::byte& b : noise) b = static_cast<std::byte>(rng());
  const std::vector<std::byte> packed = pack(noise);
  EXPECT_LE(packed.size(), packed_bound(noise.size()));
  std::vector<std::byte> back(noise.size());
  unpack_payload(packed, back);
  EXPECT_EQ(back, noise);
}

TEST(PayloadPacking, ShrinksTwoBitCodesOfNormalData) {
  // About 1.2 bits of entropy per 2-bit code: at most 70% of the payload.
  const std::vector<std::byte> raw = minmax_payload(1 << 20, 3);
  const std::vector<std::byte> packed = pack(raw);
  EXPECT_LT(static_cast<double>(packed.size()), 0.70 * static_cast<double>(raw.size()));
}

TEST(PayloadPacking, RejectsBadArguments) {
  const std::vector<std::byte> raw = minmax_payload(4096, 1);
  std::vector<std::byte> small(packed_bound(raw.size()) - 1);
  EXPECT_THROW(pack_payload(raw, small), InvalidArgument);
  const std::vector<std::byte> packed = pack(raw);
  std::vector<std::byte> wrong(raw.size() + 1);
  try {
    unpack_payload(packed, wrong);
    FAIL() << "an output of the wrong size was accepted";
  } catch (const CorruptPayload& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(raw.size())), std::string::npos)
        << e.what();
  }
}

TEST(PayloadPacking, EveryCorruptionIsCorruptPayload) {
  const std::vector<std::byte> raw = minmax_payload(20000, 2);
  const std::vector<std::byte> packed = pack(raw);
  std::vector<std::byte> out(raw.size());
  // Truncated anywhere.
  for (size_t len :
       {size_t{0}, size_t{10}, sizeof(PackedHeader), packed.size() / 2, packed.size() - 1}) {
    EXPECT_THROW(unpack_payload(std::span(packed).first(len), out), CorruptPayload) << len;
  }
  // Every single-bit flip, header and frame: either
  // CorruptPayload or, for a bit the frame does not depend on, the same
  // bytes; never other bytes.
  int detected = 0, flips = 0;
  for (size_t at = 0; at < packed.size(); ++at) {
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<std::byte> bad = packed;
      bad[at] ^= static_cast<std::byte>(1 << bit);
      ++flips;
      try {
        unpack_payload(bad, out);
        EXPECT_EQ(out, raw) << "byte " << at << " bit " << bit << " decoded to other bytes";
      } catch (const CorruptPayload&) {
        ++detected;
      }
    }
  }
  EXPECT_GT(detected, flips * 9 / 10);
}

// Frames pack_payload never writes: each is CorruptPayload.
TEST(PayloadPacking, RejectsOtherFrames) {
  const std::vector<std::byte> raw = minmax_payload(5000, 4);
  const auto framed = [](const std::vector<std::byte>& frame, size_t raw_bytes) {
    PackedHeader h;
    h.raw_bytes = raw_bytes;
    h.frame_bytes = frame.size();
    std::vector<std::byte> out(sizeof(h) + frame.size());
    std::memcpy(out.data(), &h, sizeof(h));
    std::memcpy(out.data() + sizeof(h), frame.data(), frame.size());
    return out;
  };
  const auto frame_of = [&raw](int checksum) {
    ZSTD_CCtx* c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, checksum);
    std::vector<std::byte> f(ZSTD_compressBound(raw.size()));
    f.resize(ZSTD_compress2(c, f.data(), f.size(), raw.data(), raw.size()));
    ZSTD_freeCCtx(c);
    return f;
  };
  std::vector<std::byte> out(raw.size());
  // A valid frame as pack_payload writes it unpacks.
  EXPECT_NO_THROW(unpack_payload(framed(frame_of(1), raw.size()), out));
  EXPECT_EQ(out, raw);
  // No checksum.
  EXPECT_THROW(unpack_payload(framed(frame_of(0), raw.size()), out), CorruptPayload);
  // A second frame (of nothing) behind the first.
  std::vector<std::byte> two = frame_of(1);
  std::vector<std::byte> empty(ZSTD_compressBound(0));
  empty.resize(ZSTD_compress(empty.data(), empty.size(), nullptr, 0, 1));
  two.insert(two.end(), empty.begin(), empty.end());
  EXPECT_THROW(unpack_payload(framed(two, raw.size()), out), CorruptPayload);
  // A skippable frame (magic 0x184D2A50, 4 bytes of size, then the bytes).
  std::vector<std::byte> skippable(8 + 4);
  const uint32_t skip_magic = 0x184D2A50, skip_size = 4;
  std::memcpy(skippable.data(), &skip_magic, 4);
  std::memcpy(skippable.data() + 4, &skip_size, 4);
  EXPECT_THROW(unpack_payload(framed(skippable, 0), std::span<std::byte>()), CorruptPayload);
  // Raw bytes where the frame should be.
  EXPECT_THROW(unpack_payload(framed(raw, raw.size()), out), CorruptPayload);
}

}  // namespace
}  // namespace relaxcc::kernels
