// Alltoall and alltoallv: rank r sends block p of its input to rank p and
// receives rank p's block r into block p of its output.
//   alltoall:  input and output hold size() equal blocks.
//   alltoallv: send_counts[p] elements go to p (blocks packed in rank order);
//              recv_counts[p] come from p. recv_counts[p] on rank r must equal
//              send_counts[r] on rank p: otherwise PeerMismatch on r and p
//              (ranks whose blocks all match complete normally).
// One point-to-point message per pair of ranks, each checked by the headers
// of that pair.
// Aliasing: the output must not overlap the input (InvalidArgument).
#pragma once

#include "relaxcc/collectives/options.h"

namespace relaxcc {

struct AlltoallOptions : OpOptions {};

}  // namespace relaxcc
