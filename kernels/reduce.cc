#include "relaxcc/kernels/reduce.h"

#include <algorithm>
#include <type_traits>

#include "kernels/cpu/cpu_kernels.h"
#include "relaxcc/errors.h"
#include "relaxcc/thread_pool.h"

namespace relaxcc::kernels {

namespace {

constexpr int64_t kGrain = int64_t{1} << 16;
constexpr int64_t kBlock = 1024;  // f16/bf16 are widened to f32 in blocks of this size

// Plain loops that GCC vectorizes at -O3; `out` may alias a or b exactly.
// Each is compiled twice: for the baseline ISA and for AVX2, picked at run
// time (the AVX2 build runs the same operations on wider vectors, so results
// are identical).
template <typename T>
[[gnu::always_inline]] inline void combine_loop(T* out, const T* a, const T* b, int64_t n,
                                                ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(a[i] + b[i]);
      return;
    case ReduceOp::min:
      for (int64_t i = 0; i < n; ++i) out[i] = std::min(a[i], b[i]);
      return;
    case ReduceOp::max:
      for (int64_t i = 0; i < n; ++i) out[i] = std::max(a[i], b[i]);
      return;
  }
}

template <typename T>
void combine_baseline(T* out, const T* a, const T* b, int64_t n, ReduceOp op) {
  combine_loop(out, a, b, n, op);
}

template <typename T>
[[gnu::target("avx2")]] void combine_avx2(T* out, const T* a, const T* b, int64_t n, ReduceOp op) {
  combine_loop(out, a, b, n, op);
}

template <typename T>
void combine_n(T* out, const T* a, const T* b, int64_t n, ReduceOp op) {
  if (cpu::has_avx2()) return combine_avx2(out, a, b, n, op);
  combine_baseline(out, a, b, n, op);
}

// f16/bf16: widen a block of both sides, combine in f32, round back.
void combine_16(uint16_t* out, const uint16_t* a, const uint16_t* b, int64_t n, ReduceOp op,
                bool is_bf16) {
  float x[kBlock], y[kBlock];
  for (int64_t off = 0; off < n; off += kBlock) {
    const int64_t m = std::min(kBlock, n - off);
    if (is_bf16) {
      cpu::bf16_to_f32(a + off, x, m);
      cpu::bf16_to_f32(b + off, y, m);
    } else {
      cpu::f16_to_f32(a + off, x, m);
      cpu::f16_to_f32(b + off, y, m);
    }
    combine_n(x, x, y, m, op);
    if (is_bf16)
      cpu::f32_to_bf16(x, out + off, m);
    else
      cpu::f32_to_f16(x, out + off, m);
  }
}

template <typename T>
void divide(T* dst, int64_t n, int64_t divisor) {
  if constexpr (std::is_floating_point_v<T>) {
    const T d = static_cast<T>(divisor);
    for (int64_t i = 0; i < n; ++i) dst[i] /= d;
  } else {
    const T d = static_cast<T>(divisor);
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(dst[i] / d);
  }
}

void divide_16(uint16_t* dst, int64_t n, int64_t divisor, bool is_bf16) {
  float a[kBlock];
  for (int64_t off = 0; off < n; off += kBlock) {
    const int64_t m = std::min(kBlock, n - off);
    if (is_bf16)
      cpu::bf16_to_f32(dst + off, a, m);
    else
      cpu::f16_to_f32(dst + off, a, m);
    divide(a, m, divisor);
    if (is_bf16)
      cpu::f32_to_bf16(a, dst + off, m);
    else
      cpu::f32_to_f16(a, dst + off, m);
  }
}

// Runs fn(begin, end) over [0, n), on the pool when there is one.
template <typename Fn>
void for_range(const ExecContext& ctx, int64_t n, Fn&& fn) {
  if (ctx.pool == nullptr || n < 2 * kGrain) return fn(int64_t{0}, n);
  ctx.pool->parallel_for(n, kGrain, fn);
}

void check_host(const TensorView& t, const ExecContext& ctx, const char* what) {
  t.check_valid(what);
  RELAXCC_ENFORCE(t.device.is_host() && ctx.device.is_host(), Unsupported, what, " on ", t.device,
                  ": host reduction kernels only (device reductions run inside NCCL)");
}

}  // namespace

void combine(const TensorView& out, const TensorView& a, const TensorView& b, ReduceOp op,
             const ExecContext& ctx) {
  check_host(out, ctx, "combine output");
  check_host(a, ctx, "combine input");
  check_host(b, ctx, "combine input");
  RELAXCC_ENFORCE(a.numel == out.numel && b.numel == out.numel, InvalidArgument,
                  "combine: element counts ", out.numel, ", ", a.numel, ", ", b.numel);
  RELAXCC_ENFORCE(a.dtype == out.dtype && b.dtype == out.dtype, InvalidArgument, "combine: dtypes ",
                  out.dtype, ", ", a.dtype, ", ", b.dtype);
  if (out.dtype == DType::f16 || out.dtype == DType::bf16) {
    auto* o = out.as<uint16_t>();
    const auto* x = a.as<const uint16_t>();
    const auto* y = b.as<const uint16_t>();
    const bool bf = out.dtype == DType::bf16;
    return for_range(ctx, out.numel, [&](int64_t lo, int64_t hi) {
      combine_16(o + lo, x + lo, y + lo, hi - lo, op, bf);
    });
  }
  visit_dtype(out.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_arithmetic_v<T>) {
      auto* o = out.as<T>();
      const auto* x = a.as<const T>();
      const auto* y = b.as<const T>();
      for_range(ctx, out.numel,
                [&](int64_t lo, int64_t hi) { combine_n(o + lo, x + lo, y + lo, hi - lo, op); });
    }
  });
}

void reduce_into(const TensorView& dst, const TensorView& src, ReduceOp op,
                 const ExecContext& ctx) {
  combine(dst, dst, src, op, ctx);
}

void finish_average(const TensorView& dst, int64_t divisor, const ExecContext& ctx) {
  check_host(dst, ctx, "average destination");
  RELAXCC_ENFORCE_GT(divisor, 0, InvalidArgument, "finish_average: divisor");
  if (divisor == 1) return;
  if (dst.dtype == DType::f16 || dst.dtype == DType::bf16) {
    auto* d = dst.as<uint16_t>();
    const bool bf = dst.dtype == DType::bf16;
    return for_range(ctx, dst.numel,
                     [&](int64_t b, int64_t e) { divide_16(d + b, e - b, divisor, bf); });
  }
  visit_dtype(dst.dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_arithmetic_v<T>) {
      auto* d = dst.as<T>();
      for_range(ctx, dst.numel, [&](int64_t b, int64_t e) { divide(d + b, e - b, divisor); });
    }
  });
}

}  // namespace relaxcc::kernels
