// relaxcc's dtypes and reduction ops as NCCL's (the NCCL communicator and
// relaxcc-bench's bare NCCL baseline use the same mapping).
#pragma once

#include <nccl.h>

#include "relaxcc/dtype.h"
#include "relaxcc/errors.h"
#include "relaxcc/reduce_op.h"

namespace relaxcc::nccl {

inline ncclDataType_t nccl_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::f64:
      return ncclFloat64;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
  }
  RELAXCC_THROW(InvalidArgument, "unknown dtype ", static_cast<int>(t));
}

inline ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::min:
      return ncclMin;
    case ReduceOp::max:
      return ncclMax;
  }
  RELAXCC_THROW(InvalidArgument, "unknown reduce op ", static_cast<int>(op));
}

}  // namespace relaxcc::nccl
