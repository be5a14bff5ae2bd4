#include "relaxcc/kernels/cast.h"

#include <cstring>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "relaxcc/errors.h"
#include "relaxcc/thread_pool.h"

namespace relaxcc::kernels {

namespace {
constexpr int64_t kGrain = int64_t{1} << 16;

template <typename In, typename Out>
void run_host(const TensorView& in, const TensorView& out, const ExecContext& ctx,
              void (*fn)(const In*, Out*, int64_t)) {
  const auto* src = static_cast<const In*>(in.data);
  auto* dst = static_cast<Out*>(out.data);
  if (ctx.pool == nullptr) return fn(src, dst, in.numel);
  ctx.pool->parallel_for(in.numel, kGrain,
                         [&](int64_t b, int64_t e) { fn(src + b, dst + b, e - b); });
}
}  // namespace

const char* cpu_f16_path() noexcept {
  return cpu::has_f16c() ? "f16c" : "scalar";
}

void cast(const TensorView& in, const TensorView& out, const ExecContext& ctx) {
  in.check_valid("cast input");
  out.check_valid("cast output");
  RELAXCC_ENFORCE_EQ(in.numel, out.numel, InvalidArgument, "cast: element counts");
  RELAXCC_ENFORCE(in.device == ctx.device && out.device == ctx.device, InvalidArgument,
                  "cast: tensors on ", in.device, " and ", out.device, ", context on ", ctx.device);
  if (in.dtype == out.dtype) {
    RELAXCC_ENFORCE(ctx.device.is_host(), Unsupported, "same-dtype cast on ", ctx.device);
    if (in.numel > 0 && in.data != out.data) std::memcpy(out.data, in.data, in.nbytes());
    return;
  }
  if (ctx.device.is_cuda()) return cuda::cast(in, out, ctx.stream);
  using F = float;
  using H = uint16_t;
  if (in.dtype == DType::f32 && out.dtype == DType::f16)
    return run_host<F, H>(in, out, ctx, cpu::f32_to_f16);
  if (in.dtype == DType::f16 && out.dtype == DType::f32)
    return run_host<H, F>(in, out, ctx, cpu::f16_to_f32);
  if (in.dtype == DType::f32 && out.dtype == DType::bf16)
    return run_host<F, H>(in, out, ctx, cpu::f32_to_bf16);
  if (in.dtype == DType::bf16 && out.dtype == DType::f32)
    return run_host<H, F>(in, out, ctx, cpu::bf16_to_f32);
  RELAXCC_THROW(Unsupported, "cast from ", in.dtype, " to ", out.dtype,
                ": supported pairs are f32<->f16 and f32<->bf16");
}

}  // namespace relaxcc::kernels
