#include "relaxcc/kernels/error_feedback.h"

#include "relaxcc/errors.h"

namespace relaxcc::kernels {

size_t ErrorFeedback::compress(const TensorView& in, std::span<std::byte> out,
                               const CompressorConfig& config, const ExecContext& ctx) {
  in.check_valid("error feedback input");
  RELAXCC_ENFORCE(in.dtype == DType::f32 && in.device.is_host() && ctx.device.is_host(),
                  Unsupported, "error feedback: host f32 tensors");
  RELAXCC_ENFORCE_EQ(in.numel, static_cast<int64_t>(residual_.size()), InvalidArgument,
                     "error feedback: tensor elements vs the residual's");
  const auto* x = in.as<const float>();
  const int64_t n = in.numel;
  for (int64_t i = 0; i < n; ++i) residual_[i] += x[i];  // e = x + residual
  const size_t bytes = encode(TensorView::host(residual_.data(), n), out, config, ctx);
  decode(out.first(bytes), TensorView::host(work_.data(), n), ctx);
  for (int64_t i = 0; i < n; ++i) residual_[i] -= work_[i];  // residual = e - decode(payload)
  return bytes;
}

}  // namespace relaxcc::kernels
