// OpOptions: what the options of every communicator operation share.
#pragma once

#include <cstdint>
#include <string>

#include "relaxcc/work.h"

namespace relaxcc {

struct OpOptions {
  // Higher runs first when operations compete for the network: a lower one
  // posts one segment at a time while a higher one is active.
  int priority = 0;
  // Names the tensor in errors and traces ("bucket 3").
  std::string label;
  // Submit after `after`: the operation takes its place in the
  // communicator's order at the call (its sequence number, and so its tags,
  // are fixed then), but starts, and touches its buffers, only once `after`
  // has completed. On an MpiCommunicator `after` may belong to any
  // communicator; an NcclCommunicator takes a pending Work of an NCCL
  // communicator or a completed one (Unsupported otherwise). This is how a
  // multi-stage operation (reduce in the node, across node leaders, back
  // down) is submitted from one thread in one order on every rank, with no
  // thread per chain: each stage's place is the same on every rank whatever
  // the timing. If `after` fails, this operation fails with
  // CommunicationError ("a stage it runs after failed: ..."). On an
  // MpiCommunicator its peers learn of it where the protocol allows: every
  // collective (the ring, recursive doubling and so the barrier, the
  // broadcast chain, the pairwise alltoall) sends them its header and an
  // abort record, so the peers whose result depends on this rank fail with
  // CommunicationError (broadcast.h and alltoall.h say which ranks can still
  // complete); a point-to-point batch just fails locally, so its peers see
  // their own timeout.
  WorkPtr after;
  // Arguments of a call built on this operation that the operation itself
  // does not see (a composite collective's split of the tensor, say), as a
  // hash (0: none), and what they are, for the error ("CompressedAllreduce
  // Options::shares"). Every rank must pass the same value: on a
  // communicator that exchanges operation headers (MpiCommunicator,
  // UcxCommunicator) a collective whose ranks pass different values fails
  // with PeerMismatch on every rank, naming `agree_what`, before any data
  // lands in a buffer. Other communicators do not check it.
  uint64_t agree = 0;
  std::string agree_what;
};

}  // namespace relaxcc
