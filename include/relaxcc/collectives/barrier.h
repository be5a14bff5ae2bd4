// Barrier: completes on every rank once every rank has entered it. On an
// MpiCommunicator it is a recursive-doubling allreduce (max) of one byte:
// each step waits for the step before, so it completes only once every rank
// has entered, and, as every operation, a rank that never arrives gives
// Timeout, not a hang. On an NcclCommunicator it is an ncclAllReduce of one
// int32 (nccl_communicator.h).
#pragma once

#include "relaxcc/collectives/options.h"

namespace relaxcc {

struct BarrierOptions : OpOptions {};

}  // namespace relaxcc
