#include "relaxcc/errors.h"

namespace relaxcc {

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
