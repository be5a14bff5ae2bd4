// Logging with a rank prefix and levels, like NCCL_DEBUG.
//
// The level comes from RELAXCC_DEBUG (NONE, ERROR, WARN, INFO, DEBUG, TRACE;
// default WARN), read on first use. Lines go to stderr as
//   "<host>:<pid> [rank R] relaxcc WARN <message>"
#pragma once

#include <string>
#include <string_view>

#include "relaxcc/errors.h"

namespace relaxcc {

enum class LogLevel : int { none = 0, error = 1, warn = 2, info = 3, debug = 4, trace = 5 };

// Throws InvalidArgument for an unknown name.
LogLevel parse_log_level(std::string_view name);
LogLevel log_level() noexcept;
// Overrides the level for this process (programs and tests).
void set_log_level(LogLevel level) noexcept;
inline bool log_enabled(LogLevel level) noexcept {
  return static_cast<int>(level) <= static_cast<int>(log_level());
}
void log_message(LogLevel level, std::string_view message) noexcept;

}  // namespace relaxcc

#define RELAXCC_LOG(level, ...)                                                                   \
  do {                                                                                            \
    if (::relaxcc::log_enabled(::relaxcc::LogLevel::level))                                       \
      ::relaxcc::log_message(::relaxcc::LogLevel::level, ::relaxcc::detail::concat(__VA_ARGS__)); \
  } while (0)
