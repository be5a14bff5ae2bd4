// NcclCommunicator: the Communicator over NCCL, for device (CUDA) buffers.
//
// Build. Present when relaxcc was built with CUDA and NCCL
// (RELAXCC_WITH_NCCL; config.h: RELAXCC_HAVE_NCCL). Otherwise
// create_nccl_communicator() throws Unsupported saying so.
//
// Bootstrap. The NCCL ranks are the ranks of a host communicator (an MPI
// communicator): options.bootstrap, or, when null, one made by
// create_mpi_communicator() on options.comm, which initializes MPI with
// MPI_THREAD_MULTIPLE when needed (the rules of mpi_communicator.h apply).
// Rank 0 makes an ncclUniqueId and broadcasts it over that communicator;
// every rank then creates a non-blocking NCCL communicator
// (ncclCommInitRankConfig, blocking = 0) and polls it until it is ready or
// the timeout passed (then the NCCL communicator is aborted and the call
// throws Timeout). Creation is collective over the host communicator.
//
// Devices, streams and memory. Each rank drives one CUDA device
// (options.device; -1: this rank's index among the ranks of its node, which
// must be below the number of visible devices). The communicator owns a
// non-blocking CUDA stream on that device, created with it, on which every
// one of its NCCL calls runs, and a thread that completes its Works (below).
// Nothing is global. Tensors must be CUDA tensors of that device
// (InvalidArgument otherwise, naming the tensor and its device); so must
// ExecContext::device. allocate() returns zeroed device memory from
// ncclMemAlloc. Blocks are pooled per communicator: a view's owner, when
// released, returns its block (its size rounded up to a power of two, 4 KiB
// at least) to the communicator, whose next allocate() of that size class
// reuses it (zeroed again) instead of calling ncclMemAlloc; the pool keeps
// at most 256 MiB idle and is freed (ncclMemFree) with the communicator. So
// release a view only once the device no longer uses it.
//
// Stream order. An operation is ordered after the work enqueued so far on
// ExecContext::stream (a cudaStream_t; null: the legacy default stream) by an
// event the communicator's stream waits on: the host never synchronizes.
// OpOptions::after, when set, must be a Work of an NCCL communicator (its
// event is waited on the same way) or a completed Work; a pending host Work
// is Unsupported. Each operation records a CUDA event on the communicator's
// stream after its NCCL calls; its Work completes when that event completed.
// Work::block_stream(s) makes stream `s` wait on that event
// (cudaStreamWaitEvent), without blocking the host: kernels enqueued on `s`
// afterwards see the result.
//
// Completion and callbacks. The communicator's progress thread polls the
// pending events in order (cudaEventQuery) and the NCCL communicator's
// asynchronous error (ncclCommGetAsyncError); a thread waiting on a Work
// (wait(), wait_for()) polls that Work's event itself. Whichever sees the
// event first completes the Work and runs its then() callbacks: the
// progress thread, or a thread waiting on that very Work (one whose current
// device is the communicator's; others block while the progress thread
// polls). then() on a pending Work wakes the progress thread; otherwise an
// idle progress thread finds new operations within a millisecond (and,
// after a second without any, sleeps until the next one wakes it), so an
// operation nobody waits on completes at most about that long after its
// event. Callbacks follow the rules of work.h; they may submit operations on
// this communicator.
// compute(fn) runs `fn` on the progress thread (after options.after, if any,
// on the thread that completes it).
//
// Errors. A failing CUDA or NCCL call throws DeviceError naming the rank, the
// device, the call and the tensor ("rank 1 (cuda:0): ncclAllReduce of
// 'bucket 3': unhandled system error (...)"); an asynchronous NCCL error
// found while operations are pending fails them with DeviceError and poisons
// the communicator (ncclCommAbort). A Work whose wait() times out throws
// Timeout, aborts the NCCL communicator (ncclCommAbort) and poisons this one:
// every later call throws CommunicatorPoisoned, and operations in flight
// complete with CommunicatorPoisoned; the communicator keeps their buffers
// (the views' owners) until their events completed, so the device never
// reads or writes released memory. The progress thread is also a watchdog:
// an operation still pending once the timeout passed since it was submitted
// completes with Timeout (naming the operation, the rank and the device)
// even when nobody waits on it, with the same abort and poisoning (later
// calls throw CommunicatorPoisoned naming the watchdog); so the timeout
// bounds every operation, a wait() with a longer one included. Unlike the
// MPI communicator, no poison notice reaches the other ranks: their
// operations end by their own timeout or by NCCL's asynchronous error.
// Nothing waits without a bound.
//
// Operations. allreduce, reduce_scatter, allgather and broadcast are NCCL's
// collectives. point_to_point is one ncclGroupStart / ncclSend, ncclRecv /
// ncclGroupEnd group; allgatherv and alltoall(v) are such groups too (this
// rank's own block is a device-to-device copy). barrier is an ncclAllReduce
// of one device integer (a Work that completes once every rank entered).
// NCCL has no tags and no message headers: the messages between two ranks
// match in the order they were posted whatever their tags, and a receive
// whose count or dtype differs from its send is not detected (undefined,
// as with NCCL). Not supported (Unsupported): point-to-point rounds and
// deadlines (P2POptions::round, deadline), the recursive_doubling allreduce
// (`auto` and `ring` are accepted; NCCL picks its own algorithm either way),
// a pending host Work as OpOptions::after. OpOptions::priority is not used.
//
// Hierarchy. group(), split() and split_node_local() make the matching
// communicator on the host communicator (no communication for group() and
// split_node_local() there) and then a new NCCL communicator over it (an
// ncclUniqueId broadcast among the members and ncclCommInitRankConfig): unlike
// the MPI communicator's groups, they communicate among their members and
// take milliseconds, so keep them. A group, split or node-local communicator
// whose members span several nodes is an NCCL communicator when
// options.cross_node is nccl (the default), and the host communicator itself
// (MPI, host memory) when it is mpi: the caller stages device data through
// host memory for it.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>

#include "relaxcc/communicator.h"
#include "relaxcc/tunables.h"

namespace relaxcc {

// The transport of groups and splits whose members span several nodes.
enum class CrossNodeTransport : uint8_t { nccl = 0, mpi = 1 };

struct NcclCommunicatorOptions {
  // CUDA device of this rank. -1: this rank's index among the ranks of its
  // node (the bootstrap communicator's split_node_local()).
  int device = -1;
  // The host communicator whose ranks become the NCCL ranks (and which
  // carries the ncclUniqueId). Null: create_mpi_communicator() on `comm`.
  CommunicatorPtr bootstrap;
  MPI_Comm comm = MPI_COMM_WORLD;  // used when bootstrap is null; duplicated
  Tunables tunables = Tunables::from_env();
  // Creation timeout and the default timeout of Work::wait(). Negative:
  // tunables.timeout_ms.
  std::chrono::milliseconds timeout{-1};
  CrossNodeTransport cross_node = CrossNodeTransport::nccl;
};

// Collective over the bootstrap communicator. Throws Unsupported (a build
// without NCCL, no usable CUDA device), InvalidArgument (a device index out
// of range), DeviceError (a CUDA or NCCL failure), Timeout or PeerMismatch.
CommunicatorPtr create_nccl_communicator(const NcclCommunicatorOptions& options = {});

}  // namespace relaxcc
