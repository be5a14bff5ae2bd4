// Reduce-scatter: rank r ends with chunk r of the element-wise reduction.
// input holds size() * output.numel elements; chunk r is
// input[r * output.numel, (r + 1) * output.numel). Runs the pipelined ring
// (the reduce-scatter half of the ring allreduce). The input is not modified.
// Aliasing: the output must not overlap the input (InvalidArgument).
#pragma once

#include "relaxcc/collectives/options.h"
#include "relaxcc/reduce_op.h"

namespace relaxcc {

struct ReduceScatterOptions : OpOptions {
  ReduceOp op = ReduceOp::sum;
};

}  // namespace relaxcc
