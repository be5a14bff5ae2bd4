// Allgather and allgatherv: every rank ends with every rank's input,
// concatenated in rank order. allgather: output.numel == size() * input.numel.
// allgatherv: counts[r] elements from rank r; every rank passes the same
// counts, and output.numel == sum(counts). Runs the pipelined ring (the
// allgather half of the ring allreduce).
// Aliasing: `input` may be exactly this rank's slot of `output` (in place);
// otherwise it must not overlap `output` (InvalidArgument).
#pragma once

#include "relaxcc/collectives/options.h"

namespace relaxcc {

struct AllgatherOptions : OpOptions {};

}  // namespace relaxcc
