// Sparse allreduce, random-k (issue [F] item 5, first part): every rank keeps
// the same k coordinates of its tensor, drawn from a shared (seed, step) by
// relaxcc/kernels/compressor.h's randomk (stratified, or CocktailSGD's
// rolling stride), and the ranks allreduce those k values only, at full
// precision. x then holds the sum (or average) at the kept coordinates and 0
// elsewhere; no index travels, and the bytes per rank are the ring's for k
// values. Error feedback (kernels::ErrorFeedback) keeps what was not sent
// and adds it before the next selection.
//
// Ranks that disagree on the selection (seed, step, ratio, keep or mode)
// would sum unrelated coordinates: a 16-byte allreduce of the selection's
// hash goes with the values, and every rank throws PeerMismatch, leaving x
// untouched, when the hashes differ.
#pragma once

#include "relaxcc/communicator.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/kernels/error_feedback.h"

namespace relaxcc {

struct SparseAllreduceOptions : OpOptions {
  // kind randomk; seed and step shared by every rank (the step rolls the
  // selection from call to call).
  kernels::CompressorConfig codec = [] {
    kernels::CompressorConfig c;
    c.kind = kernels::CompressorKind::randomk;
    return c;
  }();
  ReduceOp op = ReduceOp::sum;  // sum or avg
  // Set: error feedback, made for x's element count; it must outlive the
  // call's Work.
  kernels::ErrorFeedback* feedback = nullptr;
};

// InvalidArgument for a tensor that is not f32 on the host, a codec other
// than randomk, an op other than sum and avg, or feedback of another size.
WorkPtr sparse_allreduce(Communicator& comm, const TensorView& x, const ExecContext& ctx,
                         const SparseAllreduceOptions& options = {});

}  // namespace relaxcc
