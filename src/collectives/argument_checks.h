// The arguments of every Communicator operation, checked once, at a
// communicator's entry point, before anything is submitted (as NCCL's
// ncclEnqueueCheck). Each check throws InvalidArgument naming the
// operation, what was expected and what was got. Transport-neutral: a
// transport adds only its own rules (where memory must live, message size
// limits).
//
// The aliasing rule every collective states in its header:
//   an output never overlaps an input, except in the collective's in-place
//   form, and then exactly that form (the same address and size).
#pragma once

#include <vector>

#include "relaxcc/collectives/allgather.h"
#include "relaxcc/collectives/allreduce.h"
#include "relaxcc/collectives/alltoall.h"
#include "relaxcc/collectives/broadcast.h"
#include "relaxcc/collectives/point_to_point.h"
#include "relaxcc/collectives/reduce_scatter.h"
#include "relaxcc/tensor.h"

namespace relaxcc {

// A valid view (TensorView::check_valid) of a known dtype.
void check_tensor(const TensorView& t, const char* what);
void check_reduce_op(ReduceOp op, const char* what);

void check_allreduce(const TensorView& input, const TensorView& output,
                     const AllreduceOptions& options);
void check_reduce_scatter(const TensorView& input, const TensorView& output,
                          const ReduceScatterOptions& options, int size);
// Returns this rank's slot of `output`, where its own input goes.
TensorView check_allgatherv(const TensorView& input, const TensorView& output,
                            const std::vector<int64_t>& counts, int rank, int size);
void check_broadcast(const TensorView& data, const BroadcastOptions& options, int size);
// Equal blocks: input.numel must split into `size` blocks.
void check_alltoall(const TensorView& input, int size);
void check_alltoallv(const TensorView& input, const std::vector<int64_t>& send_counts,
                     const TensorView& output, const std::vector<int64_t>& recv_counts, int size);
void check_point_to_point(const std::vector<P2POp>& ops, const P2POptions& options, int size,
                          int max_tag);

// Whether the bytes of `a` and `b` overlap (empty views overlap nothing).
bool overlap(const TensorView& a, const TensorView& b) noexcept;

// Throws InvalidArgument naming `op` and both byte ranges when `output`
// overlaps `input`, unless `in_place` (the view that makes the call in place:
// `output` itself for allreduce, this rank's slot of `output` for allgather)
// is non-null and `input` is exactly it.
void check_aliasing(const char* op, const TensorView& input, const TensorView& output,
                    const TensorView* in_place);

// A point-to-point batch: no receive buffer overlaps another receive's or a
// send's (sends may share buffers: they only read).
void check_aliasing(const std::vector<P2POp>& ops);

}  // namespace relaxcc
