// create_ucx_communicator: the UCX wing's factory, for jobs started without
// mpirun (torchrun-style variables, Slurm, or processes that find each other
// by arrival order on a rendezvous store).
//
//   auto comm = create_ucx_communicator();  // everything from the environment
//
// What it does, on every process of the job:
//   1. opens the rendezvous store (rendezvous.h: served by rank 0, or by the
//      first process to bind it when ranks come by arrival), or uses
//      UcxCommunicatorOptions::store when the caller has one (torch's store);
//   2. starts a UCX worker and exchanges its address, its host and process
//      identity through the store (rendezvous());
//   3. connects an endpoint set: shared memory to peers on this host (no peer
//      error handling; their processes are watched through pidfds), TCP with
//      peer error handling to peers on other hosts;
//   4. builds the engine's communicator over it and runs the same handshake
//      as create_mpi_communicator (versions, Agree tunables, hosts).
// Only the addresses go through the store; collectives never do.
//
// Errors, each within options.timeout on every process concerned, typed and
// naming the store's address and the ranks:
//   - store unreachable: Timeout;
//   - a rank number used twice, sizes that disagree, more processes than the
//     size: PeerMismatch;
//   - a peer that never arrives: Timeout naming the missing ranks;
//   - tunables or versions that differ (the handshake): PeerMismatch;
//   - a relaxcc built without UCX: Unsupported.
//
// UCX's own configuration (UCX_* variables) is left as the user set it. When
// neither UCX_NET_DEVICES nor UCX_TLS is set and the rendezvous address is a
// loopback address (127.0.0.0/8, ::1, localhost: every process on this
// machine), the worker uses UCX_NET_DEVICES=lo (net_devices below), since UCX
// otherwise adds a lane over the host's own external address to every
// endpoint. Emulated hosts (bench/relaxcc-hosts) set UCX_NET_DEVICES and
// UCX_TLS themselves.
//
// The communicator's engine sleeps on the worker's event fd when idle and
// wakes for a message at once; waiting callers drive progress themselves, as
// on the MPI wing (mpi_communicator.h). Groups and splits work as on MPI.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "relaxcc/communicator.h"
#include "relaxcc/rendezvous.h"
#include "relaxcc/store.h"
#include "relaxcc/tunables.h"

namespace relaxcc {

struct UcxCommunicatorOptions {
  // Where and as whom to meet (RendezvousOptions::from_env() by default:
  // RELAXCC_RENDEZVOUS or MASTER_ADDR/MASTER_PORT, RANK/WORLD_SIZE and the
  // launchers' variables). Its timeout is replaced by `timeout` below.
  RendezvousOptions rendezvous = RendezvousOptions::from_env();
  Tunables tunables = Tunables::from_env();
  // Bounds the whole creation: opening the store, the rendezvous, the
  // handshake (each step gets what is left). Negative: tunables.timeout_ms.
  std::chrono::milliseconds timeout{-1};
  // Shared memory between the processes of one host (off: TCP with peer
  // error handling to every peer, as across hosts).
  bool share_memory = true;
  // A store to rendezvous on instead of opening a TcpStore at
  // rendezvous.host:port (rendezvous.host and port are then unused). Every
  // creation on one store must take its own rendezvous.generation.
  std::shared_ptr<Store> store;
  // UCX_NET_DEVICES for this worker when the user set neither
  // UCX_NET_DEVICES nor UCX_TLS: "auto" applies the rule above, "" leaves
  // UCX's default, anything else is used as given (e.g. "eth0").
  std::string net_devices = "auto";
  // Runs the new communicator on this one's engine and UCX worker (as
  // MpiCommunicatorOptions::share_engine_with): one engine thread and one
  // worker for both, priorities across both. Its rendezvous must take a
  // generation of its own (on one store, or on one rendezvous address).
  // Null: a new worker and engine. InvalidArgument when it is not a
  // communicator of create_ucx_communicator.
  CommunicatorPtr share_engine_with;
};

// Collective over the options.rendezvous.size processes. Throws Timeout,
// PeerMismatch, InvalidArgument, Unsupported or CommunicationError.
CommunicatorPtr create_ucx_communicator(const UcxCommunicatorOptions& options = {});

// True when this relaxcc was built with the UCX wing.
bool ucx_available();

}  // namespace relaxcc
