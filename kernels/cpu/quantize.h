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

// The scale s = (2^bits - 1) / (max - min), capped to FLT_MAX; 0 for a
// constant chunk. max - min must be finite. Where rounding would make the
// chunk's decoded maximum overflow (max near FLT_MAX, or a subnormal s), s
// is raised by ulps until it does not, so minmax_decoded_max(min, s, bits)
// is always finite.
float minmax_scale(float min, float max, int bits);

// The largest value a chunk with (min, scale) decodes to, with the
// dequantizer's own operations: min + (2^bits - 1) * (1 / scale), or min for
// scale 0. Every decoded value lies in [min, this] (the operations are
// monotonic in the code), so a chunk decodes to finite values exactly when
// min and this are finite.
float minmax_decoded_max(float min, float scale, int bits);

// Codes of one chunk, packed little-endian, `bits` per element; writes
// ceil(len * bits / 8) bytes. `index0` is the chunk's first element index in
// the tensor (the stochastic-rounding counter).
void quantize_chunk(const float* x, int64_t len, float min, float scale, int bits,
                    Rounding rounding, uint64_t seed, uint64_t offset, int64_t index0,
                    unsigned char* codes);
// out[i] = min + q[i] * (1 / scale), or out[i] += that when `accumulate`.
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
