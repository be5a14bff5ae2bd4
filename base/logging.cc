#include "relaxcc/logging.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <string>

#include "relaxcc/tunables.h"

namespace relaxcc {

namespace {
constexpr const char* kNames[] = {"NONE", "ERROR", "WARN", "INFO", "DEBUG", "TRACE"};

std::atomic<int>& level_storage() {
  static std::atomic<int> level{[] {
    try {
      return static_cast<int>(parse_log_level(Tunables::from_env().debug));
    } catch (const Error&) {
      return static_cast<int>(LogLevel::warn);
    }
  }()};
  return level;
}
}  // namespace

LogLevel parse_log_level(std::string_view name) {
  std::string upper(name);
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (upper == "WARNING") upper = "WARN";
  for (int i = 0; i < 6; ++i)
    if (upper == kNames[i]) return static_cast<LogLevel>(i);
  RELAXCC_THROW(InvalidArgument, "unknown log level '", name,
                "': expected NONE, ERROR, WARN, INFO, DEBUG or TRACE");
}

LogLevel log_level() noexcept {
  return static_cast<LogLevel>(level_storage().load());
}

void set_log_level(LogLevel level) noexcept {
  level_storage().store(static_cast<int>(level));
}

void log_message(LogLevel level, std::string_view message) noexcept {
  char host[64] = "?";
  gethostname(host, sizeof(host) - 1);
  std::string line;
  try {
    line = detail::concat(host, ":", getpid(), " [rank ", process_rank(), "] relaxcc ",
                          kNames[static_cast<int>(level)], " ", message, "\n");
  } catch (...) {
    return;
  }
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace relaxcc
