// Compressors: stateless encoders and hardened decoders for f32 tensors.
//
//   kind        payload after the 48-byte PayloadHeader
//   f16, bf16   n casts (round to nearest even), 2 bytes each
//   minmax      per chunk of `chunk` elements: f32 min, f32 scale s, then
//               ceil(len * bits / 8) bytes of codes q = rint((x - min) * s)
//               (or stochastic rounding), s = (2^bits - 1) / (max - min);
//               bits 8, 4, 2 or 1; a constant chunk has s = 0 and is exact
//   sign        per chunk: f32 scale = ||x||_2 / sqrt(len), then 1 bit per
//               element (set = negative); decodes to +-scale (1-bit Adam)
//   topk        k u32 indices (strictly increasing), then k f32 values: the
//               k largest |x|, exactly k, exact or sampled-threshold search
//   randomk     k f32 values only: the indices come from (seed, step), so no
//               index travels. Stratified: one index drawn in each of k equal
//               blocks. rolling: every round(1/ratio)-th element from offset
//               step mod stride (CocktailSGD); the header's chunk field holds
//               the stride
//   cocktail    randomk, then topk among those, then minmax of the kept
//               values: k u32 indices, then a minmax body of k values
//
// encoded_size(n, config) is a pure function, known on the host before any
// data moves, and equals the bytes encode() writes. Every decoder validates
// the header (magic, version, kind, sizes) and the body (index range and
// order, finite scales) and throws CorruptPayload instead of reading or
// writing out of bounds. Inputs must be finite: encode() throws
// InvalidArgument naming the first NaN or Inf (check for overflow first, as
// AMP does). Stochastic rounding draws from Philox4x32 keyed by
// ctx.rng.seed at counter ctx.rng.offset + element index, so every backend
// and every rank reproduces it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "relaxcc/exec_context.h"
#include "relaxcc/tensor.h"

namespace relaxcc::kernels {

enum class CompressorKind : uint8_t { f16 = 1, bf16 = 2, minmax = 3, sign = 4, topk = 5, randomk = 6, cocktail = 7 };
enum class Rounding : uint8_t { nearest = 0, stochastic = 1 };
enum class RandomKMode : uint8_t { stratified = 0, rolling = 1 };

const char* compressor_name(CompressorKind kind) noexcept;

struct CompressorConfig {
  CompressorKind kind = CompressorKind::minmax;
  int bits = 8;                 // minmax and cocktail: 8, 4, 2 or 1
  int64_t chunk = 2048;         // minmax and sign: elements per chunk (cocktail: 128)
  Rounding rounding = Rounding::nearest;
  double ratio = 0.01;          // topk, randomk: fraction kept; cocktail: random fraction
  int64_t keep = 0;             // topk, stratified randomk, cocktail: if > 0, exactly this many kept
  double topk_ratio = 0.2;      // cocktail: fraction of the random selection kept by top-k
  bool approximate = true;      // topk: sampled threshold instead of a full selection
  RandomKMode random_mode = RandomKMode::stratified;
  uint64_t seed = 0;            // randomk/cocktail: shared by all ranks
  uint64_t step = 0;            // randomk/cocktail: the training step (rolls the selection)

  // Throws InvalidArgument for an unsupported combination.
  void validate() const;
};

inline constexpr uint32_t kPayloadMagic = 0x50435852;  // "RXCP"
inline constexpr uint16_t kPayloadVersion = 1;

struct PayloadHeader {
  uint32_t magic = kPayloadMagic;
  uint16_t version = kPayloadVersion;
  CompressorKind kind = CompressorKind::minmax;
  uint8_t bits = 0;
  Rounding rounding = Rounding::nearest;
  RandomKMode random_mode = RandomKMode::stratified;
  uint16_t reserved = 0;
  uint32_t chunk = 0;
  int64_t n = 0;     // elements of the original tensor
  int64_t k = 0;     // elements that travel (sparse kinds)
  uint64_t seed = 0;
  uint64_t step = 0;
};
static_assert(sizeof(PayloadHeader) == 48);

// Elements kept by the sparse kinds for n elements (exactly; 0 for dense).
int64_t kept_elements(int64_t n, const CompressorConfig& config);
// Bytes encode() writes for n elements.
size_t encoded_size(int64_t n, const CompressorConfig& config);
// The true end-to-end compression ratio for n f32 elements: 4n bytes over
// encoded_size (headers, chunk scales and indices counted).
double compression_ratio(int64_t n, const CompressorConfig& config);

// Encodes the f32 tensor `in` into `out` (at least encoded_size bytes) and
// returns the bytes written.
size_t encode(const TensorView& in, std::span<std::byte> out, const CompressorConfig& config,
              const ExecContext& ctx);
// Reads the header of a host payload and checks it against its size.
// Throws CorruptPayload.
PayloadHeader read_header(std::span<const std::byte> payload);
// Checks a header against the size of its payload. Throws CorruptPayload.
void validate_header(const PayloadHeader& header, size_t payload_bytes);
// out = decode(payload); out is f32 with the payload's element count.
void decode(std::span<const std::byte> payload, const TensorView& out, const ExecContext& ctx);
// acc += decode(payload).
void decode_accumulate(std::span<const std::byte> payload, const TensorView& acc, const ExecContext& ctx);
// Re-quantizes a partial sum, as in an int8 ring with f32 accumulation:
// acc = decode(payload_in) + local, then payload_out = encode(acc) with the
// payload's own configuration. Returns the bytes written.
size_t requantize_sum(std::span<const std::byte> payload_in, const TensorView& local, const TensorView& acc,
                      std::span<std::byte> payload_out, const ExecContext& ctx);

// The configuration a payload was encoded with.
CompressorConfig config_of(const PayloadHeader& header);

}  // namespace relaxcc::kernels
