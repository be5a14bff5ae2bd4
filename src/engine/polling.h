// How an engine's threads wait for the network: whether this rank shares its
// CPUs with other ranks of its node (topology.h's shares_cpus, from the
// affinity masks exchanged in the communicator's handshake); whether the
// transport's own progress yields is the Transport's (yields_when_idle).
#pragma once

#include <string>

#include "src/engine/engine.h"

namespace relaxcc::engine {

// RELAXCC_ENGINE_POLL ("auto", "sleep" or "yield", check_tunables):
// auto waits as for shared CPUs when `shared`.
Engine::Polling choose_polling(const std::string& policy, bool shared);

}  // namespace relaxcc::engine
