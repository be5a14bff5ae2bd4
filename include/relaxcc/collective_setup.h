// Failing together in a collective setup (a constructor that verifies and
// agrees across ranks, a checkpoint load): an error that one rank raises
// alone must reach the other ranks at once, naming the rank and the reason,
// instead of leaving them to wait in the setup's next collective until
// their timeout (RELAXCC_TIMEOUT_MS, 300 s by default).
//
// Two tools, for the two places an error can arise:
//   agree_on_checks  this rank's local checks, run before the setup's first
//                    collective, then one small allgather that tells every
//                    rank which ranks failed and why; every rank throws, or
//                    none does. Nothing is poisoned: the communicator stays
//                    usable.
//   poison_on_error  the rest of the setup: an error raised part-way poisons
//                    the setup's communicators (Communicator::poison), so
//                    the peers' pending operations fail at once with
//                    CommunicatorPoisoned naming this rank and the error.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>

#include "relaxcc/communicator.h"
#include "relaxcc/errors.h"

namespace relaxcc {

// Collective over `comm`: runs `checks` (this rank's local checks, which
// must not communicate), then allgathers whether each rank's checks passed
// and, for the lowest failing rank, its error. When any rank failed, every
// rank throws: a failing rank its own error; every other rank an error of
// the lowest failing rank's type (InvalidArgument or Unsupported, PeerMismatch
// for other types) saying "<what>: rank R failed: <its message>" (the
// message's first 400 characters). The allgather waits `timeout` (negative:
// the communicator's default, RELAXCC_TIMEOUT_MS).
void agree_on_checks(Communicator& comm, const std::string& what,
                     const std::function<void()>& checks,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));

// Runs `fn`, this rank's part of a collective sequence over `comms`. An
// error that `fn` raises poisons each of `comms` with the error's message
// (what(): kind, rank, message, location), then propagates. A PeerMismatch
// is raised by the ranks together and poisons nothing. Null entries are
// skipped; a communicator poisoned already stays as it is.
template <typename F>
decltype(auto) poison_on_error(std::initializer_list<Communicator*> comms, F&& fn) {
  try {
    return std::forward<F>(fn)();
  } catch (const PeerMismatch&) {
    throw;
  } catch (const std::exception& e) {
    for (Communicator* c : comms)
      if (c != nullptr) c->poison(e.what());
    throw;
  }
}

}  // namespace relaxcc
