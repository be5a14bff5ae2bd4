#include "src/engine/engine_work.h"

#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <sstream>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "relaxcc/logging.h"

namespace relaxcc::engine {

std::string EngineWork::describe() const {
  return detail::concat(name_, " #", seq_, detail::of_label(label_), " (tag ", tag_, ", ",
                        details_ ? details_() : std::string(), ")");
}

bool EngineWork::await(Clock::time_point deadline) {
  auto engine = engine_.lock();
  return engine ? engine->drive(*this, deadline) : block_until(deadline);
}

void EngineWork::on_callback_queued() {
  if (auto engine = engine_.lock()) engine->wake_for_callbacks();
}

std::string EngineWork::on_timeout(const std::string& reason) {
  auto engine = engine_.lock();
  auto lane = lane_.lock();
  return engine && lane ? engine->poison_on_timeout(lane, *this, reason) : std::string();
}

}  // namespace relaxcc::engine
