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
// sample a threshold, scan for candidates at or above it (vectorized:
// compares, then index and value compacted with one shuffle per 8 elements),
// then a histogram of the candidates' magnitudes finds the k-th largest to
// keep exactly k (a threshold too high for k is lowered and the scan
// repeated). exact: a full selection of the k-th largest magnitude first.
// Throws InvalidArgument, "<what>: element <i> is <x[i]>...", naming the
// first NaN or infinity.
Selection topk(const float* x, int64_t n, int64_t k, bool approximate, const ExecContext& ctx,
               const char* what = "topk");

// The same among the `count` elements x[offset + j * stride], j in [0,
// count), in one pass over them (no gathered copy), written straight to
// indices[0, min(k, count)) (x's indices) and values[0, min(k, count)).
void topk_strided(const float* x, int64_t offset, int64_t stride, int64_t count, int64_t k,
                  bool approximate, const ExecContext& ctx, const char* what, uint32_t* indices,
                  float* values);

// Index of the first NaN or infinity in x[0, n), or -1 (vectorized).
int64_t first_non_finite(const float* x, int64_t n, const ExecContext& ctx);

}  // namespace relaxcc::kernels::cpu
