// Top-k selection by magnitude on the CPU: exactly k indices, ascending.
#pragma once

#include <cstdint>
#include <vector>

#include "relaxcc/exec_context.h"

namespace relaxcc::kernels::cpu {

// The k elements of largest |x| (ties broken by lower index), as ascending
// indices. approximate: sample a threshold, scan for candidates above it
// (vectorized), then trim (or, rarely, retry lower) to exactly k. exact:
// a full selection of the k-th largest magnitude.
std::vector<uint32_t> topk_indices(const float* x, int64_t n, int64_t k, bool approximate,
                                   const ExecContext& ctx);

// k-th largest magnitude among x[idx[i]] (k >= 1).
float kth_magnitude(const float* x, const uint32_t* idx, int64_t count, int64_t k);

}  // namespace relaxcc::kernels::cpu
