#include "relaxcc/kernels/chunk_topk.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/topk.h"
#include "relaxcc/errors.h"
#include "relaxcc/kernels/compressor.h"

namespace relaxcc::kernels {

namespace {

constexpr size_t kHeader = sizeof(ChunkTopkHeader);

CompressorConfig values_codec(int bits, int64_t group) {
  CompressorConfig c;
  c.kind = CompressorKind::minmax;
  c.bits = bits;
  c.chunk = group;
  c.rounding = Rounding::nearest;
  return c;
}

int index_bytes(int64_t chunk) {
  return chunk <= 256 ? 1 : 2;
}

int64_t kept(int64_t n, int64_t chunk, int64_t per_chunk) {
  return (n / chunk) * per_chunk + std::min(per_chunk, n % chunk);
}

void check_tensor(const TensorView& t, const char* what) {
  RELAXCC_ENFORCE(t.dtype == DType::f32 && t.device.is_host(), InvalidArgument, "chunk_topk ", what,
                  ": expected an f32 host tensor");
}

}  // namespace

void ChunkTopkConfig::validate() const {
  RELAXCC_ENFORCE(chunk >= 1 && chunk <= 65536, InvalidArgument,
                  "chunk_topk: ChunkTopkConfig.chunk must be in [1, 65536], got ", chunk);
  RELAXCC_ENFORCE(ratio > 0 && ratio <= 1, InvalidArgument,
                  "chunk_topk: ChunkTopkConfig.ratio (the fraction of each chunk kept) must be in "
                  "(0, 1], got ",
                  ratio);
  RELAXCC_ENFORCE(bits == 8 || bits == 4 || bits == 2 || bits == 1, InvalidArgument,
                  "chunk_topk: ChunkTopkConfig.bits must be 8, 4, 2 or 1, got ", bits);
  RELAXCC_ENFORCE(group >= 1 && group <= (int64_t{1} << 30), InvalidArgument,
                  "chunk_topk: ChunkTopkConfig.group must be in [1, 2^30], got ", group);
}

int64_t chunk_topk_per_chunk(const ChunkTopkConfig& c) {
  c.validate();
  const auto kc = static_cast<int64_t>(std::ceil(c.ratio * static_cast<double>(c.chunk)));
  return std::clamp<int64_t>(kc, 1, c.chunk);
}

int64_t chunk_topk_kept(int64_t n, const ChunkTopkConfig& c) {
  RELAXCC_ENFORCE(n >= 0, InvalidArgument, "chunk_topk: element count must be >= 0, got ", n);
  return kept(n, c.chunk, chunk_topk_per_chunk(c));
}

size_t chunk_topk_encoded_size(int64_t n, const ChunkTopkConfig& c) {
  const int64_t k = chunk_topk_kept(n, c);
  return kHeader + static_cast<size_t>(k) * static_cast<size_t>(index_bytes(c.chunk)) +
         encoded_size(k, values_codec(c.bits, c.group));
}

size_t chunk_topk_encode(const TensorView& in, std::span<std::byte> out, const ChunkTopkConfig& c,
                         const ExecContext& ctx) {
  check_tensor(in, "encode");
  const int64_t n = in.numel;
  const size_t bytes = chunk_topk_encoded_size(n, c);
  RELAXCC_ENFORCE(out.size() >= bytes, InvalidArgument, "chunk_topk encode: output of ", out.size(),
                  " bytes, need ", bytes);
  const float* x = in.as<float>();
  const int64_t bad = cpu::first_non_finite(x, n, ctx);
  RELAXCC_ENFORCE(bad < 0, InvalidArgument, "chunk_topk encode: element ", bad, " is ",
                  bad < 0 ? 0.0f : x[bad], " (inputs must be finite)");
  ChunkTopkHeader h;
  h.bits = static_cast<uint8_t>(c.bits);
  h.index_bytes = static_cast<uint8_t>(index_bytes(c.chunk));
  h.chunk = static_cast<uint32_t>(c.chunk);
  h.per_chunk = static_cast<uint32_t>(chunk_topk_per_chunk(c));
  h.group = static_cast<uint32_t>(c.group);
  h.n = n;
  h.k = chunk_topk_kept(n, c);
  std::memcpy(out.data(), &h, kHeader);
  // Each chunk's top kc by cpu::topk_strided (exact, ascending indices).
  std::vector<float> values(static_cast<size_t>(h.k));
  std::vector<uint32_t> picked(h.per_chunk);
  std::byte* idx = out.data() + kHeader;
  int64_t at = 0;
  for (int64_t first = 0; first < n; first += c.chunk) {
    const int64_t len = std::min<int64_t>(c.chunk, n - first);
    const int64_t kc = std::min<int64_t>(h.per_chunk, len);
    cpu::topk_strided(x, first, 1, len, kc, false, ctx, "chunk_topk encode", picked.data(),
                      values.data() + at);
    for (int64_t j = 0; j < kc; ++j) {
      const auto local = static_cast<uint16_t>(picked[static_cast<size_t>(j)] - first);
      if (h.index_bytes == 1) {
        idx[at + j] = static_cast<std::byte>(local);
      } else {
        std::memcpy(idx + 2 * (at + j), &local, 2);
      }
    }
    at += kc;
  }
  const size_t head = kHeader + static_cast<size_t>(h.k) * h.index_bytes;
  const size_t body = encode(TensorView::host(values.data(), h.k), out.subspan(head, bytes - head),
                             values_codec(c.bits, c.group), ExecContext::host());
  return head + body;
}

void chunk_topk_decode(std::span<const std::byte> payload, const TensorView& out, bool accumulate,
                       const ExecContext& ctx) {
  check_tensor(out, "decode");
  RELAXCC_ENFORCE(payload.size() >= kHeader, CorruptPayload, "chunk_topk payload: ", payload.size(),
                  " bytes, shorter than its ", kHeader, "-byte header");
  ChunkTopkHeader h;
  std::memcpy(&h, payload.data(), kHeader);
  RELAXCC_ENFORCE(h.magic == kChunkTopkMagic && h.version == kChunkTopkVersion && h.reserved == 0,
                  CorruptPayload, "chunk_topk payload: magic ", h.magic, " version ", h.version,
                  " reserved ", h.reserved, " (expected ", kChunkTopkMagic, ", ", kChunkTopkVersion,
                  ", 0)");
  RELAXCC_ENFORCE(h.bits == 8 || h.bits == 4 || h.bits == 2 || h.bits == 1, CorruptPayload,
                  "chunk_topk payload: bits ", int{h.bits}, " (expected 8, 4, 2 or 1)");
  RELAXCC_ENFORCE(h.chunk >= 1 && h.chunk <= 65536 && h.index_bytes == index_bytes(h.chunk),
                  CorruptPayload, "chunk_topk payload: chunk ", h.chunk, " with ",
                  int{h.index_bytes},
                  "-byte indices (expected a chunk in [1, 65536], 1-byte "
                  "indices up to 256)");
  RELAXCC_ENFORCE(h.per_chunk >= 1 && h.per_chunk <= h.chunk, CorruptPayload,
                  "chunk_topk payload: ", h.per_chunk, " kept per chunk of ", h.chunk);
  RELAXCC_ENFORCE(h.group >= 1 && h.group <= (uint32_t{1} << 30), CorruptPayload,
                  "chunk_topk payload: group ", h.group, " (expected [1, 2^30])");
  RELAXCC_ENFORCE(h.n == out.numel, CorruptPayload, "chunk_topk payload: ", h.n,
                  " elements, expected ", out.numel);
  const int64_t k = kept(h.n, h.chunk, h.per_chunk);
  RELAXCC_ENFORCE(h.k == k, CorruptPayload, "chunk_topk payload: ", h.k,
                  " kept elements, expected ", k, " for ", h.n, " elements");
  const size_t head = kHeader + static_cast<size_t>(k) * h.index_bytes;
  const size_t expected = head + encoded_size(k, values_codec(h.bits, h.group));
  RELAXCC_ENFORCE(payload.size() == expected, CorruptPayload,
                  "chunk_topk payload: ", payload.size(), " bytes, expected ", expected);
  // Indices: in their chunk and strictly increasing within it.
  std::vector<int64_t> where(static_cast<size_t>(k));
  const std::byte* idx = payload.data() + kHeader;
  int64_t at = 0;
  for (int64_t first = 0; first < h.n; first += h.chunk) {
    const int64_t len = std::min<int64_t>(h.chunk, h.n - first);
    const int64_t kc = std::min<int64_t>(h.per_chunk, len);
    int64_t previous = -1;
    for (int64_t j = 0; j < kc; ++j, ++at) {
      uint16_t local = 0;
      if (h.index_bytes == 1) {
        local = static_cast<uint16_t>(idx[at]);
      } else {
        std::memcpy(&local, idx + 2 * at, 2);
      }
      RELAXCC_ENFORCE(local < len && local > previous, CorruptPayload, "chunk_topk payload: index ",
                      local, " in the chunk at ", first, " of ", len, " elements after ", previous,
                      " (expected strictly increasing, < ", len, ")");
      previous = local;
      where[static_cast<size_t>(at)] = first + local;
    }
  }
  // The values: a min-max payload, validated and decoded by its kernels.
  std::vector<float> values(static_cast<size_t>(k));
  decode(payload.subspan(head), TensorView::host(values.data(), k), ExecContext::host(ctx.pool));
  float* o = out.as<float>();
  if (!accumulate) std::fill(o, o + h.n, 0.0f);
  for (int64_t j = 0; j < k; ++j)
    o[where[static_cast<size_t>(j)]] += values[static_cast<size_t>(j)];
}

}  // namespace relaxcc::kernels
