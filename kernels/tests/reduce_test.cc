// Host reduction kernels: exact on integers, f16/bf16 computed in f32.
#include <vector>

#include <gtest/gtest.h>

#include "relaxcc/errors.h"
#include "relaxcc/kernels/reduce.h"
#include "relaxcc/thread_pool.h"

namespace relaxcc::kernels {
namespace {

TEST(Reduce, IntegersExact) {
  ThreadPool pool(2);
  const int64_t n = 300001;
  std::vector<int64_t> a(n), b(n);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = i % 97 - 40;
    b[i] = (i * 7) % 89 - 30;
  }
  for (ReduceOp op : kAllReduceOps) {
    auto d = a;
    reduce_into(TensorView::host(d.data(), n), TensorView::host(b.data(), n), op,
                ExecContext::host(&pool));
    if (op == ReduceOp::avg) finish_average(TensorView::host(d.data(), n), 2, ExecContext::host());
    for (int64_t i = 0; i < n; ++i) {
      int64_t want = 0;
      switch (op) {
        case ReduceOp::sum:
          want = a[i] + b[i];
          break;
        case ReduceOp::avg:
          want = (a[i] + b[i]) / 2;
          break;
        case ReduceOp::min:
          want = std::min(a[i], b[i]);
          break;
        case ReduceOp::max:
          want = std::max(a[i], b[i]);
          break;
      }
      ASSERT_EQ(d[i], want) << op << " i=" << i;
    }
  }
}

TEST(Reduce, HalfInF32) {
  const int64_t n = 5000;
  std::vector<uint16_t> a(n), b(n);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = f32_to_f16_bits(static_cast<float>(i % 100) * 0.25f);
    b[i] = f32_to_f16_bits(static_cast<float>(i % 7));
  }
  reduce_into(TensorView{a.data(), n, DType::f16}, TensorView{b.data(), n, DType::f16},
              ReduceOp::sum, ExecContext::host());
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(f16_bits_to_f32(a[i]),
              static_cast<float>(i % 100) * 0.25f + static_cast<float>(i % 7));
  std::vector<uint16_t> c(n, f32_to_bf16_bits(3.0f));
  finish_average(TensorView{c.data(), n, DType::bf16}, 2, ExecContext::host());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bf16_bits_to_f32(c[i]), 1.5f);
}

TEST(Reduce, RejectsMismatchedViews) {
  std::vector<float> a(4), b(5);
  std::vector<double> c(4);
  EXPECT_THROW(reduce_into(TensorView::host(a.data(), 4), TensorView::host(b.data(), 5),
                           ReduceOp::sum, ExecContext::host()),
               InvalidArgument);
  EXPECT_THROW(reduce_into(TensorView::host(a.data(), 4), TensorView::host(c.data(), 4),
                           ReduceOp::sum, ExecContext::host()),
               InvalidArgument);
}

}  // namespace
}  // namespace relaxcc::kernels
