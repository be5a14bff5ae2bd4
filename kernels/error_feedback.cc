#include "relaxcc/kernels/error_feedback.h"

#include "relaxcc/errors.h"

namespace relaxcc::kernels {

size_t compress_with_feedback(const TensorView& in, std::span<float> residual,
                              std::span<float> scratch, std::span<std::byte> out,
                              const CompressorConfig& config, const ExecContext& ctx) {
  in.check_valid("error feedback input");
  RELAXCC_ENFORCE(in.dtype == DType::f32 && in.device.is_host() && ctx.device.is_host(),
                  Unsupported, "error feedback: host f32 tensors");
  RELAXCC_ENFORCE(in.numel == static_cast<int64_t>(residual.size()) &&
                      in.numel == static_cast<int64_t>(scratch.size()),
                  InvalidArgument, "error feedback: ", in.numel, " tensor elements, ",
                  residual.size(), " residual and ", scratch.size(), " scratch elements");
  const auto* x = in.as<const float>();
  const int64_t n = in.numel;
  // e = x + residual in scratch: an input the codec refuses leaves the
  // residual as it was.
  for (int64_t i = 0; i < n; ++i) scratch[i] = x[i] + residual[i];
  const size_t bytes = encode(TensorView::host(scratch.data(), n), out, config, ctx);
  decode(out.first(bytes), TensorView::host(residual.data(), n), ctx);
  for (int64_t i = 0; i < n; ++i) residual[i] = scratch[i] - residual[i];  // e - decode(payload)
  return bytes;
}

size_t ErrorFeedback::compress(const TensorView& in, std::span<std::byte> out,
                               const CompressorConfig& config, const ExecContext& ctx) {
  return compress_with_feedback(in, residual_, work_, out, config, ctx);
}

}  // namespace relaxcc::kernels
