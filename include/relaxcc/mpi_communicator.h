// MpiCommunicator: the Communicator over Open MPI (or any MPI-3 library).
//
// MPI thread level: relaxcc needs MPI_THREAD_MULTIPLE, because each
// communicator's engine thread makes MPI calls while other threads (other
// communicators' engines, the application) may make theirs.
//   - If the application already called MPI_Init_thread, relaxcc never
//     initializes MPI, and create() throws Unsupported when the provided
//     level is below MPI_THREAD_MULTIPLE.
//   - Otherwise create() calls MPI_Init_thread(MPI_THREAD_MULTIPLE) and
//     registers MPI_Finalize to run at process exit.
//
// Threading: one engine thread per communicator owns every MPI call on it.
// Calling threads only enqueue operations and wait on Work. The engine
// sleeps on a condition variable when idle; while requests are pending it
// polls for RELAXCC_SPIN_US, then backs off with sleeps up to
// RELAXCC_MAX_SLEEP_US, so oversubscribed ranks do not starve each other.
//
// create() works on its own MPI_Comm_dup of the given communicator with
// MPI_ERRORS_RETURN, so MPI failures become relaxcc exceptions. Ranks then
// exchange a handshake (library version, dtype sizes, hash of the Agree-scoped
// tunables); any difference raises PeerMismatch on every rank.
#pragma once

#include <mpi.h>

#include <chrono>
#include <memory>

#include "relaxcc/communicator.h"
#include "relaxcc/tunables.h"

namespace relaxcc {

struct MpiCommunicatorOptions {
  MPI_Comm comm = MPI_COMM_WORLD;  // duplicated; the caller keeps ownership
  Tunables tunables = Tunables::from_env();
  // Timeout of the creation handshake. Negative: tunables.timeout_ms.
  std::chrono::milliseconds timeout{-1};
};

// Collective over options.comm. Throws Timeout, PeerMismatch, Unsupported or
// CommunicationError.
CommunicatorPtr create_mpi_communicator(const MpiCommunicatorOptions& options = {});

}  // namespace relaxcc
