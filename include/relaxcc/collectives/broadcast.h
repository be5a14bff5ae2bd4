// Broadcast: every rank ends with the root's tensor, in place. Wraps
// MPI_Ibcast behind a header agreement, so counts or dtypes that differ
// across ranks raise PeerMismatch on every rank.
#pragma once

#include <string>

namespace relaxcc {

struct BroadcastOptions {
  int root = 0;
  int priority = 0;
  std::string label;
};

}  // namespace relaxcc
