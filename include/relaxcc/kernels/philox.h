// Philox4x32-10 (Salmon et al., SC'11): a counter-based random number
// generator. The same (key, counter) gives the same numbers on every rank,
// on the CPU and on CUDA devices, with no state to carry.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define RELAXCC_HD __host__ __device__
#else
#define RELAXCC_HD
#endif

namespace relaxcc::kernels {

struct Philox4x32 {
  uint32_t v[4];
};

RELAXCC_HD constexpr Philox4x32 philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4x32{{c0, c1, c2, c3}};
}

// The uniform u in (0, 1) that stochastic rounding adds to element `index`
// of stream (seed, offset): code = floor(v + u), clamped, v = (x - min) *
// scale in f32. One Philox4x32-10 block, counter offset + index / 16
// (counter_hi 0), serves sixteen consecutive elements, 8 bits each: element
// `index` takes byte index % 4 (from the low end) of word (index % 16) / 4,
// that is byte index % 16 of the block's words v[0..3] laid out
// little-endian, as h in [0, 255], and u = (2h + 1) / 2^9, the midpoint of
// one of 2^8 equal cells (exact in f32). For v with fractional part f, the
// code rounds up with probability floor(2^8 f + 1/2) / 2^8, within 2^-9 of
// f: the expected code is within 2^-9 of a quantization step of v, apart
// from the f32 rounding of v + u. Every backend computes u with this
// function or reproduces it bit for bit (the AVX2 and AVX-512VL paths).
inline constexpr uint64_t rounding_block_elements = 16;
RELAXCC_HD constexpr uint64_t rounding_counter(uint64_t offset, uint64_t index) {
  return offset + index / rounding_block_elements;
}
// u of element `index` from its block, philox4x32(seed, 0, rounding_counter()).
RELAXCC_HD constexpr float rounding_uniform_of(const Philox4x32& block, uint64_t index) {
  const uint64_t byte = index % rounding_block_elements;
  const uint32_t h = (block.v[byte / 4] >> (8 * (byte % 4))) & 0xFFu;
  return static_cast<float>(2 * h + 1) * (1.0f / 512.0f);
}
RELAXCC_HD constexpr float rounding_uniform(uint64_t seed, uint64_t offset, uint64_t index) {
  return rounding_uniform_of(philox4x32(seed, 0, rounding_counter(offset, index)), index);
}

// Stratified random-k (randomk and cocktail's first stage) of k of n
// elements (1 <= k <= n < 2^32): the index drawn in block b of
// [b n / k, (b + 1) n / k), from word 0 of philox4x32(seed, step, b). The
// products stay below 2^64.
RELAXCC_HD constexpr uint64_t stratified_index(uint64_t n, uint64_t k, uint64_t b, uint64_t seed,
                                               uint64_t step) {
  const uint64_t lo = b * n / k, hi = (b + 1) * n / k;
  return lo + philox4x32(seed, step, b).v[0] % (hi - lo);
}

}  // namespace relaxcc::kernels
