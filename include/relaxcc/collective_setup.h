// Failing together in a collective setup (a constructor that verifies and
// agrees across ranks, a checkpoint load): an error that one rank raises
// alone must reach the other ranks at once, naming the rank and the reason,
// instead of leaving them to wait in the setup's next collective until
// their timeout (RELAXCC_TIMEOUT_MS, 300 s by default).
//
// Two tools:
//   agree_on_checks  runs this rank's part of a setup step (local checks, or
//                    a step that communicates), then one small allgather
//                    tells every rank which ranks failed and why: every rank
//                    throws, or none does, and the communicator stays
//                    usable. A rank that failed waits a short grace for the
//                    others; when they do not come (they wait in a
//                    collective of the step that it never joined), it
//                    poisons the communicators instead, so they fail at
//                    once.
//   poison_on_error  for steps with no agreement: an error poisons the
//                    step's communicators (Communicator::poison), so the
//                    peers' pending operations fail at once with
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

// Collective over `comm`: runs `step`, then allgathers whether each rank's
// step passed and, for a failing rank, its error. When any rank failed,
// every rank throws: a failing rank its own error; every other rank an
// error of the lowest failing rank's type (InvalidArgument or Unsupported,
// PeerMismatch for other types) saying "<what>: rank R failed: <its
// message>" (the message's first 400 characters). The allgather waits
// `timeout` (negative: the communicator's default, RELAXCC_TIMEOUT_MS) on a
// rank whose step passed, and `grace` on a rank whose step failed: when the
// others have not joined it by then, that rank poisons `comm` and
// `also_poison` with its error (what()) and throws it, and the others fail
// with CommunicatorPoisoned naming it; a PeerMismatch, which the ranks of
// the failed collective raise together, poisons nothing. `step` may
// communicate (on `comm` or the communicators of `also_poison`).
void agree_on_checks(Communicator& comm, const std::string& what, const std::function<void()>& step,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(-1),
                     std::initializer_list<Communicator*> also_poison = {},
                     std::chrono::milliseconds grace = std::chrono::milliseconds(500));

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
