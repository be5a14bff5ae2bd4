// What the decoder fuzz targets (decode_fuzzer.cc, chunk_topk_fuzzer.cc)
// share: their input as bytes, and the checks they assert with (a breach
// prints "<target>: <what> at element <i>: <v>" to stderr, then traps,
// which libFuzzer reports as a crash).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace relaxcc::fuzz {

// A copy of the fuzzer's input (size bytes at data), for the target to
// change (force header fields) before it decodes.
inline std::vector<std::byte> copy_input(const uint8_t* data, size_t size) {
  std::vector<std::byte> payload(size);
  if (size > 0) std::memcpy(payload.data(), data, size);
  return payload;
}

// The fuzzer's failure signal: print what broke (`target` names the
// fuzzer), then trap.
[[noreturn]] inline void fail(const char* target, const char* what, int64_t i, float v) {
  std::fprintf(stderr, "%s: %s at element %lld: %g\n", target, what, static_cast<long long>(i),
               static_cast<double>(v));
  __builtin_trap();
}

// Fails with `what` at the first of v[0, n) that is not finite.
inline void require_finite(const char* target, const std::vector<float>& v, int64_t n,
                           const char* what) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(v[static_cast<size_t>(i)])) fail(target, what, i, v[static_cast<size_t>(i)]);
}

}  // namespace relaxcc::fuzz
