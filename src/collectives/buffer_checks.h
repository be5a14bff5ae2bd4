// The aliasing rule every collective states in its header, checked at the
// communicator's entry point, once, for every collective alike:
//   an output never overlaps an input, except in the collective's in-place
//   form, and then exactly that form (the same address and size).
// Transport-neutral: every communicator applies it before it submits anything.
#pragma once

#include <vector>

#include "relaxcc/collectives/point_to_point.h"
#include "relaxcc/tensor.h"

namespace relaxcc {

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
