// Compressors: stateless encoders and hardened decoders for f32 tensors.
//
//   kind        payload after the 48-byte PayloadHeader
//   f16, bf16   n casts (round to nearest even), 2 bytes each
//   minmax      per chunk of `chunk` elements: f32 min, f32 scale field f,
//               then ceil(len * bits / 8) bytes of codes
//               q = rint((x - min) * s) (or stochastic rounding), decoded
//               min + q * (1 / s), s = |f| ~= (2^bits - 1) / (max - min);
//               bits 8, 4, 2 or 1; a constant chunk has f = 0 and is exact.
//               A chunk whose range max - min is below 2^-100 is pre-scaled,
//               marked by f's sign bit: q = rint(((x - min) * 2^100) * s),
//               decoded min + (q * (1 / s)) * 2^-100, s = |f| ~= (2^bits -
//               1) / ((max - min) 2^100), so that s stays finite and the
//               step normal however small the range. s is raised by ulps
//               where rounding would decode the top code above max. So every
//               value decodes into [min, max] of its chunk, and round to
//               nearest is within half a step (max - min) / (2^bits - 1) of
//               the input, besides the f32 rounding of the operations
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
//               values: k u32 indices, then a minmax body of k values.
//               When top-k keeps the whole random selection (topk_ratio 1,
//               or keep >= its size), no index travels: the header's
//               implicit_stride is set and the body is the minmax body
//               alone, the values in the selection's (ascending) order
//
// encoded_size(n, config) is a pure function, known on the host before any
// data moves, and equals the bytes encode() writes.
//
// Stochastic rounding (minmax, cocktail): code = floor((x - min) * s + u)
// (pre-scaled: floor(((x - min) * 2^100) * s + u)), clamped, where
// u = rounding_uniform(ctx.rng.seed, ctx.rng.offset, i) of philox.h for
// element i of the encoded values: 8 random bits per element (byte i % 16
// of the block, u = (2h + 1) / 2^9), one Philox4x32-10 block (counter
// ctx.rng.offset + i / 16) per sixteen elements. The code rounds up with
// probability floor(256 f + 1/2) / 256, within 2^-9 of the fractional part
// f of (x - min) * s, so the expected code is within 2^-9 of a quantization
// step of (x - min) * s (besides the f32 rounding of the sum), and each
// decoded value lies within one step of the input, in [min, max]; every
// backend and every rank reproduces the payload. Streams that must not
// share random bits need counter ranges that do not overlap: offsets n
// apart for n elements suffice.
//
// Encoder contract. Inputs must be finite, and representable by the kind:
// encode() throws InvalidArgument naming the first element that is NaN or
// Inf (check for overflow first, as AMP does), that overflows f16 (|x| >=
// 65520, which rounds past 65504) or bf16 (|x| that rounds past 3.3895e38),
// or, for minmax and cocktail, the first chunk whose range max - min
// overflows f32. A payload encode() writes always decodes, on every
// backend, to finite values only.
//
// Decoder contract (decode, decode_accumulate, requantize_sum, read_header,
// validate_header; host and CUDA alike). The output view is trusted; the
// payload is not. Anything wrong with a payload, including an element count
// that disagrees with the output's, throws CorruptPayload naming what was
// expected and what was found, and nothing is written to the output:
//   - the header: magic, version, kind, bits, chunk, flags, counts, and the
//     exact payload size;
//   - f16, bf16: an Inf or NaN bit pattern (exponent all ones) is corrupt,
//     since encode() never writes one (it rejects the values that would
//     round to Inf);
//   - minmax, cocktail: every chunk's min and scale field must be finite
//     (either sign: the sign bit marks pre-scaling), and the chunk's decoded
//     range [min, min + ((2^bits - 1) * (1 / |f|)) * d] (d = 2^-100 when
//     pre-scaled, else 1) must be finite in f32 (a flipped bit that makes the
//     scale tiny is caught here);
//   - sign: every chunk scale finite and >= 0;
//   - topk, randomk, cocktail: every index in range and strictly
//     increasing, every value finite.
// So decode() of any payload either throws CorruptPayload or writes only
// finite values (decode_accumulate adds finite values to the accumulator;
// the sum itself can overflow as any f32 addition can).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "relaxcc/errors.h"
#include "relaxcc/exec_context.h"
#include "relaxcc/tensor.h"

namespace relaxcc::kernels {

enum class CompressorKind : uint8_t {
  f16 = 1,
  bf16 = 2,
  minmax = 3,
  sign = 4,
  topk = 5,
  randomk = 6,
  cocktail = 7
};
enum class Rounding : uint8_t { nearest = 0, stochastic = 1 };
enum class RandomKMode : uint8_t { stratified = 0, rolling = 1 };

const char* compressor_name(CompressorKind kind) noexcept;

// Fields are read only by the kinds named in their comment; other kinds
// ignore them. validate() (called by encoded_size() and encode()) throws
// InvalidArgument naming the field, its valid range and the value got, for
// each field the kind reads:
struct CompressorConfig {
  // One of the seven kinds above.
  CompressorKind kind = CompressorKind::minmax;
  // minmax, cocktail: bits per element, one of 8, 4, 2, 1.
  int bits = 8;
  // minmax, sign, cocktail: elements per chunk (one min and scale, or one
  // sign scale, each), in [1, 2^30]. cocktail quantizes its kept values in
  // chunks of this size (128 is typical there).
  int64_t chunk = 2048;
  // minmax, cocktail: nearest or stochastic. Every kind checks that it is
  // one of the two (it travels in the header).
  Rounding rounding = Rounding::nearest;
  // topk, randomk: fraction kept; cocktail: fraction the random stage keeps.
  // In (0, 1]; with random_mode rolling (randomk, cocktail) also >= 2^-30,
  // so that the stride round(1 / ratio) is in [1, 2^30].
  double ratio = 0.01;
  // topk, stratified randomk, cocktail: if > 0, exactly min(keep, n) kept
  // (cocktail: of the random selection), overriding the ratios. >= 0.
  int64_t keep = 0;
  // cocktail: fraction of the random selection kept by top-k, in (0, 1].
  double topk_ratio = 0.2;
  // topk, cocktail: sampled threshold instead of a full selection (same
  // result up to ties).
  bool approximate = true;
  // randomk, cocktail: stratified or rolling; every kind checks it, as
  // `rounding`.
  RandomKMode random_mode = RandomKMode::stratified;
  // randomk, cocktail: shared by all ranks; any value.
  uint64_t seed = 0;
  // randomk, cocktail: the training step (rolls the selection); any value.
  uint64_t step = 0;

  // Throws InvalidArgument for a field out of its range (see above).
  void validate() const;
};

inline constexpr uint32_t kPayloadMagic = 0x50435852;  // "RXCP"
// 2: cocktail's implicit_stride; 3: pre-scaled minmax chunks (a negative
// scale field).
inline constexpr uint16_t kPayloadVersion = 3;

struct PayloadHeader {
  uint32_t magic = kPayloadMagic;
  uint16_t version = kPayloadVersion;
  CompressorKind kind = CompressorKind::minmax;
  uint8_t bits = 0;
  Rounding rounding = Rounding::nearest;
  RandomKMode random_mode = RandomKMode::stratified;
  // cocktail: 0 when its k indices travel. Otherwise they are the random
  // stage's selection, recomputed from (n, k, seed, step): 1 in stratified
  // mode, the rolling stride in rolling mode (strides above 65535 send
  // their indices). 0 for every other kind.
  uint16_t implicit_stride = 0;
  uint32_t chunk = 0;
  int64_t n = 0;  // elements of the original tensor
  int64_t k = 0;  // elements that travel (sparse kinds)
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
// Throws CorruptPayload (see the decoder contract above).
PayloadHeader read_header(std::span<const std::byte> payload);
// Checks a header against the size of its payload. Throws CorruptPayload.
void validate_header(const PayloadHeader& header, size_t payload_bytes);
// out = decode(payload); out is f32 with the payload's element count (a
// payload whose count differs is CorruptPayload). Throws CorruptPayload,
// writing nothing, for a corrupt payload; otherwise writes finite values.
void decode(std::span<const std::byte> payload, const TensorView& out, const ExecContext& ctx);
// acc += decode(payload), with the same validation as decode().
void decode_accumulate(std::span<const std::byte> payload, const TensorView& acc,
                       const ExecContext& ctx);
// Re-quantizes a partial sum, as in an int8 ring with f32 accumulation:
// acc = decode(payload_in) + local, then payload_out = encode(acc) with the
// payload's own configuration. Returns the bytes written.
size_t requantize_sum(std::span<const std::byte> payload_in, const TensorView& local,
                      const TensorView& acc, std::span<std::byte> payload_out,
                      const ExecContext& ctx);

// The configuration a payload was encoded with, as far as its header tells:
// re-encoding with it gives a payload of the same form and size. A cocktail
// payload whose indices travel does not carry its first-stage ratio: its
// configuration keeps the count k with ratio 1.
CompressorConfig config_of(const PayloadHeader& header);

}  // namespace relaxcc::kernels
