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

// A uniform float in [0, 1) for element `index` of stream (seed, offset):
// 24 random bits, exact in f32, identical on every backend.
RELAXCC_HD constexpr float philox_uniform(uint64_t seed, uint64_t offset, uint64_t index) {
  const uint64_t counter = offset + (index >> 2);
  const Philox4x32 r = philox4x32(seed, 0, counter);
  return static_cast<float>(r.v[index & 3] >> 8) * (1.0f / 16777216.0f);
}

}  // namespace relaxcc::kernels
