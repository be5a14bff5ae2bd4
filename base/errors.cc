#include "relaxcc/errors.h"

#include <cstdlib>

namespace relaxcc {

int process_rank() noexcept {
  static const int rank = [] {
    for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "RANK"}) {
      if (const char* v = std::getenv(name); v != nullptr && *v != '\0') {
        char* end = nullptr;
        const long r = std::strtol(v, &end, 10);
        if (end != v && *end == '\0' && r >= 0) return static_cast<int>(r);
      }
    }
    return -1;
  }();
  return rank;
}

namespace {
std::string format(std::string_view kind, const std::string& message, const char* file, int line,
                   int rank) {
  std::ostringstream os;
  if (rank >= 0) os << "[rank " << rank << "] ";
  os << "relaxcc::" << kind << ": " << message << " (" << file << ":" << line << ")";
  return os.str();
}
}  // namespace

Error::Error(std::string_view kind, std::string message, const char* file, int line)
    : std::runtime_error(format(kind, message, file, line, process_rank())),
      message_(std::move(message)),
      file_(file),
      line_(line),
      rank_(process_rank()) {}

std::string detail::message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& error) {
    return error.message();
  } catch (const std::exception& error) {
    return error.what();
  } catch (...) {
    return "an exception of unknown type";
  }
}

}  // namespace relaxcc
