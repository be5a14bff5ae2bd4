// The transport-neutral communicator: what a wing's factory
// (create_mpi_communicator, create_ucx_communicator) builds once it made a
// Transport and the endpoint set of the new communicator.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "relaxcc/communicator.h"
#include "relaxcc/tunables.h"
#include "src/engine/transport.h"

namespace relaxcc::engine {

struct EngineCommunicatorOptions {
  Tunables tunables = Tunables::from_env();
  // Timeout of the creation handshake (not negative).
  std::chrono::milliseconds timeout{0};
  // The factory's name, for the handshake's errors ("create_mpi_communicator").
  std::string creator = "create_communicator";
  // Runs the new communicator as a lane of this one's engine (see
  // MpiCommunicatorOptions::share_engine_with). It must be a communicator
  // built here over the same Transport (InvalidArgument otherwise).
  CommunicatorPtr share_engine_with;
};

// A communicator over every rank of `endpoints` (whose transport is
// `transport`): starts an engine (or joins share_engine_with's), runs the
// handshake (versions, Agree tunables, hosts, CPU masks: Timeout when a rank
// does not arrive within options.timeout, PeerMismatch when ranks differ) and
// sets the polling and the node layout from it. Groups and splits of it use
// the same endpoint set (tag windows keep them apart); nothing else of the
// wing is called but `transport` and `endpoints`. Throws InvalidArgument for
// options.tunables that check_tunables (src/engine/tunables_check.h)
// refuses, before the handshake (the wing's factory checks them before it
// connects, so a wing's ranks fail at once).
CommunicatorPtr create_engine_communicator(std::shared_ptr<Transport> transport,
                                           std::shared_ptr<Endpoints> endpoints,
                                           const EngineCommunicatorOptions& options);

// The Transport an engine communicator runs on (null for another kind of
// communicator): a wing checks share_engine_with with it.
std::shared_ptr<Transport> transport_of(const Communicator& comm);

// Waits at most `timeout` for engines still being destroyed on threads of
// their own (an engine whose last reference went inside a completion
// callback); a wing calls it before it shuts its transport down. Returns how
// many are left.
int wait_for_reaped_engines(std::chrono::milliseconds timeout);

}  // namespace relaxcc::engine
