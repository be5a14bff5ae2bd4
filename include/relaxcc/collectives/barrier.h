// Barrier: completes on every rank once every rank has entered it. Wraps
// MPI_Ibarrier, so a rank that never arrives gives Timeout, not a hang.
#pragma once

#include "relaxcc/collectives/options.h"

namespace relaxcc {

struct BarrierOptions : OpOptions {};

}  // namespace relaxcc
