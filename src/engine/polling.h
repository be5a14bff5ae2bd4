// How an engine's threads wait for the network: whether this rank shares its
// CPUs with other ranks of its node (topology.h's shares_cpus, from the
// affinity masks exchanged in the communicator's handshake), and whether
// MPI's own progress yields.
#pragma once

#include <string>

#include "src/engine/engine.h"

namespace relaxcc::engine {

// Whether MPI's progress engine calls sched_yield when a poll finds nothing
// (Open MPI's mpi_yield_when_idle, which mpirun sets for oversubscribed
// runs), read through the MPI tool interface; false when it has no such
// variable.
bool mpi_yields_when_idle();

// RELAXCC_ENGINE_POLL ("auto", "sleep" or "yield"; InvalidArgument
// otherwise): auto waits as for shared CPUs when `shared`.
Engine::Polling choose_polling(const std::string& policy, bool shared);

}  // namespace relaxcc::engine
