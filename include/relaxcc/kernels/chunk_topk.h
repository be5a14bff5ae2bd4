// Chunk-wise top-k with quantized values: SparseLoCo's pseudo-gradient codec
// (arXiv 2508.15706). The tensor is cut into chunks of `chunk` elements (the
// last one may be shorter); each chunk keeps its kc = min(ceil(ratio *
// chunk), len) largest |x| (ties: lower index), and the kept values are
// quantized with min-max `bits`-bit codes in groups of `group` kept values.
//
// Payload (host, little-endian):
//   ChunkTopkHeader (40 bytes: magic "RXCT", version, bits, index bytes,
//     chunk, kc, group, n, K = total kept elements);
//   K chunk-relative indices, 1 byte each when chunk <= 256, else 2, each
//     chunk's kc (or min(kc, len)) indices strictly increasing;
//   a minmax payload of relaxcc/kernels/compressor.h holding the K kept
//     values (bits, chunk = group; its own 48-byte header), so the values
//     are encoded and validated by the min-max kernels.
// Size: chunk_topk_encoded_size(n, config), a pure function of n and the
// configuration. At chunk 64, ratio 0.03 (2 of 64), 2 bits and group 128 a
// kept value costs 1 + 2/8 + 8/128 bytes: about 98x fewer bytes than f32.
//
// Encoder contract: inputs must be finite (InvalidArgument naming the first
// element that is not), and each group's kept range max - min finite.
// Decoder contract, as compressor.h's: the payload is untrusted; a wrong
// magic, version, field, size, element count (against the output's), an
// index out of its chunk or out of order, or a value body that does not
// decode throws CorruptPayload and writes nothing; otherwise only finite
// values are written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "relaxcc/exec_context.h"
#include "relaxcc/tensor.h"

namespace relaxcc::kernels {

struct ChunkTopkConfig {
  // Elements per selection chunk, in [1, 65536] (SparseLoCo: 64).
  int64_t chunk = 64;
  // Fraction of each chunk kept, in (0, 1]: kc = ceil(ratio * chunk).
  double ratio = 0.03;
  // Bits per kept value: 8, 4, 2 or 1 (SparseLoCo: 2).
  int bits = 2;
  // Kept values per min-max scale, in [1, 2^30].
  int64_t group = 128;
  // Throws InvalidArgument naming the field, its range and the value got.
  void validate() const;
};

inline constexpr uint32_t kChunkTopkMagic = 0x54435852;  // "RXCT"
inline constexpr uint16_t kChunkTopkVersion = 1;

struct ChunkTopkHeader {
  uint32_t magic = kChunkTopkMagic;
  uint16_t version = kChunkTopkVersion;
  uint8_t bits = 0;
  uint8_t index_bytes = 0;
  uint32_t chunk = 0;
  uint32_t per_chunk = 0;  // kc
  uint32_t group = 0;
  uint32_t reserved = 0;
  int64_t n = 0;  // elements of the tensor
  int64_t k = 0;  // elements kept in all
};
static_assert(sizeof(ChunkTopkHeader) == 40);

// kc: elements kept per full chunk.
int64_t chunk_topk_per_chunk(const ChunkTopkConfig& config);
// Elements kept of a tensor of n elements.
int64_t chunk_topk_kept(int64_t n, const ChunkTopkConfig& config);
// Bytes chunk_topk_encode() writes for n elements.
size_t chunk_topk_encoded_size(int64_t n, const ChunkTopkConfig& config);
// Encodes the f32 host tensor `in` into `out` (at least encoded_size bytes);
// returns the bytes written.
size_t chunk_topk_encode(const TensorView& in, std::span<std::byte> out,
                         const ChunkTopkConfig& config, const ExecContext& ctx);
// out = decode(payload), or out += decode(payload) when `accumulate`; out
// is f32 on the host with the payload's element count. Throws
// CorruptPayload, writing nothing, for a corrupt payload.
void chunk_topk_decode(std::span<const std::byte> payload, const TensorView& out, bool accumulate,
                       const ExecContext& ctx);

}  // namespace relaxcc::kernels
