// The clock of the engine's deadlines, back-offs and traces.
#pragma once

#include <chrono>

namespace relaxcc::engine {

using Clock = std::chrono::steady_clock;

}  // namespace relaxcc::engine
