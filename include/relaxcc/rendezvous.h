// Rendezvous: the processes of a job started without mpirun find each other
// through a Store. Each contributes a blob (its transport's worker address,
// host id, pid); each gets its rank, the size and every rank's blob. Only
// blobs and small agreement values go through the store; collectives never do.
//
//   auto options = RendezvousOptions::from_env();
//   auto store = open_rendezvous_store(options);
//   RendezvousResult r = rendezvous(options, *store, my_address);
//
// Every failure is a typed error within options.timeout (the process serving
// the store may take up to 0.5 s more while the others learn of it), on
// every process concerned, naming the store's address:
// - the store unreachable: Timeout (open_rendezvous_store);
// - a rank number used twice: PeerMismatch naming the rank and both
//   processes (host and pid), on both and on the ranks waiting with them;
// - sizes that disagree: PeerMismatch naming both sizes and the ranks;
// - a peer that never arrives: Timeout naming the missing ranks;
// - more processes than the size, with ranks by arrival: PeerMismatch on
//   the processes after the first `size`, which go on without them (a
//   process that comes after the serving process ended finds no store: it
//   serves one of its own and times out waiting for the others).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "relaxcc/launch.h"
#include "relaxcc/store.h"

namespace relaxcc {

struct RendezvousOptions {
  // The store's address.
  std::string host;
  uint16_t port = 0;
  // This process's rank, or -1: assigned by arrival order (an atomic add on
  // the store).
  int rank = -1;
  // The number of processes; required.
  int size = -1;
  // Keys live under "relaxcc/rendezvous/<job>/<generation>/": the processes
  // of one communicator share both, and each new communicator created on
  // the same store takes another generation.
  std::string job = "relaxcc";
  uint64_t generation = 0;
  // Bounds open_rendezvous_store and rendezvous, each.
  std::chrono::milliseconds timeout{300000};

  // The options the environment gives:
  // - host and port: RELAXCC_RENDEZVOUS=host:port ([v6addr]:port for IPv6),
  //   else torchrun's MASTER_ADDR and MASTER_PORT;
  // - rank and size: LaunchEnvironment::from_env()'s (no rank: -1, by
  //   arrival);
  // - timeout: RELAXCC_TIMEOUT_MS.
  // Throws InvalidArgument naming the variable whose value does not parse.
  // Fields the environment does not give keep their defaults.
  static RendezvousOptions from_env();
  // "host:port".
  std::string address() const;
  // Throws InvalidArgument unless host, port and size are set and rank is
  // -1 or in [0, size).
  void validate() const;
};

// Opens the store that `options` names, with options.timeout as its timeout.
// Who serves it: the process of rank 0 (listening on every interface, as
// torchrun's master); with ranks by arrival, the first process that binds
// host:port (host must then be an address of the serving machine); every
// other process connects, retrying until options.timeout.
std::unique_ptr<Store> open_rendezvous_store(const RendezvousOptions& options);

struct RendezvousResult {
  int rank = -1;
  int size = 0;
  // blobs[r]: the blob rank r contributed.
  std::vector<std::vector<uint8_t>> blobs;
};

// Exchanges `blob` with the other processes of options.size under options'
// job and generation. On the process serving the store (Store::is_server),
// it returns only when every process has every blob, and on a failure only
// when every process has learned of it (or at the timeout), so that process
// may close the store once this returns. The store keeps the keys; a later
// rendezvous on the same store takes another generation.
RendezvousResult rendezvous(const RendezvousOptions& options, Store& store,
                            std::span<const uint8_t> blob);

}  // namespace relaxcc
