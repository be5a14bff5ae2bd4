// Broadcast: every rank ends with the root's tensor, in place. Wraps
// MPI_Ibcast behind a header agreement, so counts or dtypes that differ
// across ranks raise PeerMismatch on every rank.
#pragma once

#include "relaxcc/collectives/options.h"

namespace relaxcc {

struct BroadcastOptions : OpOptions {
  int root = 0;
};

}  // namespace relaxcc
