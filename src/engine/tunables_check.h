// The one check of every tunable the engine and its communicators use. Each
// wing's factory (create_mpi_communicator, create_ucx_communicator) calls it
// first, before any connection, so a bad value fails its rank at once;
// create_engine_communicator and the Engine constructor call it again for
// callers that reach them otherwise (a few string compares and the parse of
// the allreduce table, once per communicator). Past them, the engine takes
// the values as given.
#pragma once

#include "relaxcc/tunables.h"

namespace relaxcc::engine {

// Throws InvalidArgument naming the variable and its accepted values for:
// RELAXCC_ALLREDUCE_ALGO (a selection table, AllreduceSelection::parse),
// RELAXCC_ENGINE_POLL (auto, sleep, yield), RELAXCC_PEER_TIMEOUT_MS (0 or
// 200..600000), RELAXCC_TIMEOUT_MS (positive), RELAXCC_RANKS_PER_NODE (not
// negative), the segment sizes and RELAXCC_WINDOW_BYTES (positive),
// RELAXCC_PIPELINE_DEPTH and RELAXCC_LINK_MBIT (not negative) and
// RELAXCC_ROUND_PART_BYTES (at least 1024).
void check_tunables(const Tunables& t);

}  // namespace relaxcc::engine
