// Barrier: completes on every rank once every rank has entered it. Wraps
// MPI_Ibarrier, so a rank that never arrives gives Timeout, not a hang.
#pragma once

#include <string>

namespace relaxcc {

struct BarrierOptions {
  std::string label;
};

}  // namespace relaxcc
