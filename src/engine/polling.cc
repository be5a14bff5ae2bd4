#include "src/engine/polling.h"

#include <algorithm>

#include "relaxcc/errors.h"

namespace relaxcc::engine {

Engine::Polling choose_polling(const std::string& policy, bool shared) {
  RELAXCC_ENFORCE(policy == "auto" || policy == "sleep" || policy == "yield", InvalidArgument,
                  "RELAXCC_ENGINE_POLL='", policy, "': expected auto, sleep or yield");
  Engine::Polling polling;
  const bool yield = policy == "yield" || (policy == "auto" && !shared);
  polling.backoff = yield ? Engine::Backoff::yield : Engine::Backoff::sleep;
  return polling;
}

}  // namespace relaxcc::engine
