// CPU min-max quantization and sign compression of one chunk. The AVX2 and
// scalar paths run the same IEEE operations in the same order (no FMA:
// kernels build with -ffp-contract=off), so they agree bit for bit with each
// other and with the CUDA kernels.
#pragma once

#include <cstdint>

#include "relaxcc/kernels/compressor.h"

namespace relaxcc::kernels::cpu {

struct ChunkRange {
  float min = 0, max = 0;
  int64_t first_non_finite = -1;  // index within the chunk, or -1
};
ChunkRange chunk_range(const float* x, int64_t len);

// A chunk's scale field f: |f| is the scale s, and a set sign bit marks a
// pre-scaled chunk, quantized at kMinmaxPrescale times its size (a range
// max - min below 1 / kMinmaxPrescale, whose s = (2^bits - 1) / (max - min)
// could overflow f32, or whose step (max - min) / (2^bits - 1) would be
// subnormal and lose bits). Codes q = round(((x - min) * p) * s) and values
// min + (q * (1 / s)) * d, with (p, d) = (kMinmaxPrescale, 1 /
// kMinmaxPrescale) for a pre-scaled chunk and (1, 1) otherwise (the
// multiplications by 1 are exact). Both factors are powers of two, so the
// pre-scaling is exact wherever it does not round into the subnormals.
inline constexpr float kMinmaxPrescale = 0x1p100f;

// The scale field of a chunk [min, max] (max - min finite): 0 for a
// constant chunk; else s = (2^bits - 1) / (max - min), or with the sign bit
// set s = (2^bits - 1) / ((max - min) * kMinmaxPrescale) for a range below
// 1 / kMinmaxPrescale. Then |s| is raised by ulps while rounding makes
// minmax_decoded_max exceed max (a few at most: the decoded maximum is
// within a few ulps of max - min above min), so every decoded value lies in
// [min, max], finite.
float minmax_scale(float min, float max, int bits);

// The largest value a chunk with (min, scale field) decodes to, with the
// dequantizer's own operations: min + ((2^bits - 1) * (1 / s)) * d, or min
// for s = 0. Every decoded value lies in [min, this] (the operations are
// monotonic in the code), so a chunk decodes to finite values exactly when
// min and this are finite.
float minmax_decoded_max(float min, float scale, int bits);

// Codes of one chunk, packed little-endian, `bits` per element; writes
// ceil(len * bits / 8) bytes. `index0` is the chunk's first element index in
// the tensor (the stochastic-rounding counter).
void quantize_chunk(const float* x, int64_t len, float min, float scale, int bits,
                    Rounding rounding, uint64_t seed, uint64_t offset, int64_t index0,
                    unsigned char* codes);
// out[i] = min + (q[i] * (1 / s)) * d (see kMinmaxPrescale), or out[i] +=
// that when `accumulate`.
void dequantize_chunk(const unsigned char* codes, int64_t len, float min, float scale, int bits,
                      float* out, bool accumulate);

// Sign bits of x (bit i of byte i / 8 set when x[i] has its sign bit set),
// (len + 7) / 8 bytes.
void sign_pack(const float* x, int64_t len, unsigned char* bits);
// sum_i x_i^2 in double, in a fixed order whatever the path (AVX2: four
// lanes of four partial sums, then the tail); not finite when an x_i is not.
double sum_of_squares(const float* x, int64_t len);
// out[i] = bit i set ? -scale : scale, or out[i] += that when `accumulate`.
void sign_unpack(const unsigned char* bits, int64_t len, float scale, float* out, bool accumulate);

}  // namespace relaxcc::kernels::cpu
