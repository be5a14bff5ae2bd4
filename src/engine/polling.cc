#include "src/engine/polling.h"

#include <algorithm>

#include "relaxcc/errors.h"

namespace relaxcc::engine {

Engine::Polling choose_polling(const std::string& policy, bool shared) {
  Engine::Polling polling;
  const bool yield = policy == "yield" || (policy == "auto" && !shared);
  polling.backoff = yield ? Engine::Backoff::yield : Engine::Backoff::sleep;
  return polling;
}

}  // namespace relaxcc::engine
