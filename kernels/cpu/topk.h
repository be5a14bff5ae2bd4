// Top-k selection by magnitude on the CPU: exactly k elements, ascending
// indices, with their values.
#pragma once

#include <cstdint>
#include <vector>

#include "relaxcc/exec_context.h"

namespace relaxcc::kernels::cpu {

struct Selection {
  std::vector<uint32_t> indices;  // ascending
  std::vector<float> values;      // x[indices[j]]
};

// The k elements of largest |x| (ties broken by lower index). approximate:
// sample a threshold, scan for candidates above it (vectorized, collecting
// index and value), then trim (or, rarely, retry lower) to exactly k.
// exact: a full selection of the k-th largest magnitude first. Throws
// InvalidArgument naming the first NaN or infinity.
Selection topk(const float* x, int64_t n, int64_t k, bool approximate, const ExecContext& ctx);

// Index of the first NaN or infinity in x[0, n), or -1 (vectorized).
int64_t first_non_finite(const float* x, int64_t n, const ExecContext& ctx);

}  // namespace relaxcc::kernels::cpu
