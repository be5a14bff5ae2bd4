// Broadcast: every rank ends with the root's tensor, in place. Runs a
// pipelined chain root -> root+1 -> ... (segments of RELAXCC_SEGMENT_BYTES).
// Counts, dtypes or roots that differ raise PeerMismatch on the ranks on both
// sides of the disagreement, on every rank after them in the chain, and on
// ranks that exchanged headers with a disagreeing rank (every collective
// exchanges headers with its ring neighbours and butterfly partners); other
// ranks before the disagreement hold the root's data and complete normally.
#pragma once

#include "relaxcc/collectives/options.h"

namespace relaxcc {

struct BroadcastOptions : OpOptions {
  int root = 0;
};

}  // namespace relaxcc
