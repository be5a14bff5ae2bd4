// Error feedback for any compressor: the part of a tensor that compression
// dropped is added back before the next compression, so nothing is lost over
// time. State lives here, not in the (stateless) kernels.
//
//   e = x + residual;  payload = encode(e);  residual = e - decode(payload)
#pragma once

#include <span>
#include <vector>

#include "relaxcc/kernels/compressor.h"

namespace relaxcc::kernels {

// The step itself, on caller-owned memory: `residual` (in.numel elements) is
// added to `in` before encoding and left holding what the payload misses;
// `scratch` (in.numel elements) is overwritten. Returns the bytes written.
size_t compress_with_feedback(const TensorView& in, std::span<float> residual,
                              std::span<float> scratch, std::span<std::byte> out,
                              const CompressorConfig& config, const ExecContext& ctx);

class ErrorFeedback {
 public:
  explicit ErrorFeedback(int64_t numel)
      : residual_(static_cast<size_t>(numel), 0.0f), work_(residual_.size()) {}

  // Compresses `in` (f32, numel elements) with its residual added and keeps
  // what the payload misses. Returns the bytes written to `out`.
  size_t compress(const TensorView& in, std::span<std::byte> out, const CompressorConfig& config,
                  const ExecContext& ctx);

  const std::vector<float>& residual() const noexcept { return residual_; }
  std::vector<float>& residual() noexcept { return residual_; }
  void reset() { std::fill(residual_.begin(), residual_.end(), 0.0f); }

 private:
  std::vector<float> residual_;
  std::vector<float> work_;
};

}  // namespace relaxcc::kernels
