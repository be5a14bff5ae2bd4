// MpiCommunicator: the Communicator over Open MPI (or any MPI-3 library).
//
// MPI initialization and thread level. relaxcc needs MPI_THREAD_MULTIPLE,
// because each communicator's engine thread makes MPI calls while other
// threads (other communicators' engines, the application) may make theirs.
//   - When MPI is not initialized, create_mpi_communicator() calls
//     MPI_Init_thread(MPI_THREAD_MULTIPLE) itself and registers MPI_Finalize
//     to run at process exit (std::atexit). An application that uses MPI
//     only through relaxcc needs no MPI call of its own, but must release
//     its communicators before main returns: one with static storage would
//     outlive MPI_Finalize, and its engine may still call MPI.
//   - An application that makes MPI calls itself, or passes its own MPI_Comm
//     in MpiCommunicatorOptions::comm, must call
//     MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) before its first relaxcc
//     call (plain MPI_Init gives a lower level). relaxcc then never
//     initializes or finalizes MPI: the application calls MPI_Finalize
//     itself, after releasing every relaxcc communicator (and every object
//     that holds one, such as a Reducer).
//   - create_mpi_communicator() throws Unsupported when MPI was initialized
//     with a level below MPI_THREAD_MULTIPLE.
//
// Threading: one engine per communicator family (a communicator made by
// create_mpi_communicator, with its groups and splits, and the communicators
// created to share its engine: share_engine_with). Once the communicator
// exists, every MPI call of an operation on it is made by the one thread that
// holds the engine's progress token, and the token is only ever tried, never
// waited for. That thread is
//   - the engine's own thread, while no caller drives progress;
//   - a caller blocked in Work::wait (or wait_for), which takes the token and
//     runs the progress iterations itself until its Work completes, so a
//     blocking wait needs no hand-off to another thread;
//   - a caller of a recursive-doubling allreduce (the small sizes) while the
//     engine is quiet (nothing active, queued or signalled, no `after`): the
//     operation runs to completion on the caller at once, on a lane of two
//     ranks as a direct exchange whose requests the caller tests itself,
//     outside the engine's request table; when it cannot finish at once it
//     becomes an ordinary operation of the engine and its Work is returned.
// Any other call takes its sequence number, queues its operation and returns
// its Work without calling MPI. create_mpi_communicator() itself calls MPI on
// the calling thread (initialization and the two duplicates); its handshake
// is an operation like the others.
// The engine thread sleeps on a condition variable when idle; while requests
// are pending the token's holder polls for RELAXCC_SPIN_US, then yields or
// sleeps (up to RELAXCC_MAX_SLEEP_US), so oversubscribed ranks do not starve
// each other.
//
// create_mpi_communicator() duplicates the given communicator twice (two
// MPI_Comm_idup posted together, under MPI_ERRORS_RETURN; its own handler is
// restored afterwards), the only calls it makes on it, and works on the
// duplicates with MPI_ERRORS_RETURN, so MPI failures become relaxcc
// exceptions. Ranks then exchange a handshake, a relaxcc allgather of the
// library version, a hash of the dtype sizes and Agree-scoped tunables, and
// the host; any difference raises PeerMismatch on every rank. Each of the
// two steps has the full timeout. When a rank does not arrive in time, the
// ranks that called get Timeout (or CommunicatorPoisoned, when another
// rank's handshake timed out first: both are CommunicationError). MPI cannot
// cancel a collective: the timed-out pair of MPI_Comm_idup stays parked,
// cached on the given communicator (an MPI attribute), and the next creation
// on it waits for the same pair. So ranks that retry while the late rank
// arrives all get a working communicator; a late rank whose peers gave up
// gets Timeout from the handshake. The application should not free a
// communicator that holds such a parked pair.
//
// Lost peers. Without `mpirun --enable-recovery`, Open MPI ends the whole job
// when a rank dies. With it, the job goes on, but Open MPI 4.1 (no ULFM)
// reports nothing about the dead rank through its API: requests to and from
// it stay pending. relaxcc then detects the loss by its heartbeats: a peer
// silent for RELAXCC_PEER_TIMEOUT_MS (default 2 s; a dead or a stopped
// process alike) fails the operations with it with PeerLost naming it, or
// by the operation's timeout if that comes first, whose message names the
// ranks it waited for; the poison notice fails the other ranks' operations
// at once (communicator.h). Receives from the lost peer are cancelled; sends
// to it stay posted (Open MPI cannot fail them). A transport that does
// report a failed peer (an MPI error in a request's status) fails the
// operation at once, naming the peer, and poisons the communicator.
// MPI_Finalize after a rank died may hang in Open MPI 4.1: such a job should
// end its surviving ranks with _exit once it has reported the failure.
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
  // Runs the new communicator on this one's engine (its thread and polling;
  // tunables.spin_us, max_sleep_us and trace_file stay that engine's) as a
  // lane of its own, instead of starting an engine thread: a process whose
  // communicators all share one engine has one engine thread, and priorities
  // apply across all of them. Null: a new engine. InvalidArgument when it is
  // not an MPI communicator.
  CommunicatorPtr share_engine_with;
};

// Collective over options.comm. Throws Timeout, PeerMismatch, Unsupported or
// CommunicationError.
CommunicatorPtr create_mpi_communicator(const MpiCommunicatorOptions& options = {});

}  // namespace relaxcc
