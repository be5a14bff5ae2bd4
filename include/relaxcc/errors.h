// relaxcc's error model.
//
// Every failure is a typed exception derived from relaxcc::Error. Each one
// records the file and line that raised it and the process rank (from the
// launcher's environment, -1 when unknown). Library code never calls exit or
// abort. Raise errors with the RELAXCC_THROW / RELAXCC_ENFORCE* macros, which
// fill in the location and build the message from any streamable arguments:
//
//   RELAXCC_ENFORCE_EQ(a.numel, b.numel, InvalidArgument, "allreduce: tensor sizes");
//   -> "[rank 1] InvalidArgument: allreduce: tensor sizes: expected a.numel == b.numel,
//       got 12 vs 16 (src/x.cc:42)"
#pragma once

#include <charconv>
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace relaxcc {

// The process rank of this job as its launcher reports it
// (LaunchEnvironment::from_env, relaxcc/launch.h: torchrun, Open MPI, PMIx,
// PMI, Slurm), or -1. Used to prefix errors and log lines.
int process_rank() noexcept;

class Error : public std::runtime_error {
 public:
  Error(std::string_view kind, std::string message, const char* file, int line);

  // The message without kind, rank and location.
  const std::string& message() const noexcept { return message_; }
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }
  int rank() const noexcept { return rank_; }

 private:
  std::string message_;
  const char* file_;
  int line_;
  int rank_;
};

#define RELAXCC_DEFINE_ERROR(Name, Base)                                         \
  class Name : public Base {                                                     \
   public:                                                                       \
    Name(std::string message, const char* file, int line)                        \
        : Base(#Name, std::move(message), file, line) {}                         \
                                                                                 \
   protected:                                                                    \
    Name(std::string_view kind, std::string message, const char* file, int line) \
        : Base(kind, std::move(message), file, line) {}                          \
  }

// A caller passed something the operation cannot accept (null data with a
// nonzero count, a size that does not fit, an unknown name).
RELAXCC_DEFINE_ERROR(InvalidArgument, Error);
// The combination is valid in general but not built or not implemented here
// (an op for a dtype, a device without CUDA).
RELAXCC_DEFINE_ERROR(Unsupported, Error);
// A payload failed validation while decoding (truncated, corrupt, hostile).
RELAXCC_DEFINE_ERROR(CorruptPayload, Error);
// A broken invariant inside relaxcc: a bug, never the caller's fault.
RELAXCC_DEFINE_ERROR(InternalError, Error);
// The transport failed (an MPI error code, a lost peer).
RELAXCC_DEFINE_ERROR(CommunicationError, Error);
// A wait ran past its timeout. The communicator it ran on is poisoned.
RELAXCC_DEFINE_ERROR(Timeout, CommunicationError);
// Ranks disagree: counts, dtypes, ops, versions or configuration differ.
RELAXCC_DEFINE_ERROR(PeerMismatch, CommunicationError);
// A CUDA or NCCL call failed: the message names the rank, the device, the call
// and the tensor or operation.
RELAXCC_DEFINE_ERROR(DeviceError, CommunicationError);
// The communicator was poisoned by an earlier timeout or transport failure and
// accepts no more operations.
RELAXCC_DEFINE_ERROR(CommunicatorPoisoned, CommunicationError);

#undef RELAXCC_DEFINE_ERROR

// The transport gave up on a peer (its process ended, its connection closed,
// it stopped answering): peer() is its rank in the communicator the failed
// operation ran on (-1 when unknown), and the message names it.
class PeerLost : public CommunicationError {
 public:
  PeerLost(int peer, std::string message, const char* file, int line)
      : CommunicationError("PeerLost", std::move(message), file, line), peer_(peer) {}
  int peer() const noexcept { return peer_; }

 private:
  int peer_;
};

namespace detail {
// Appends `v` as `std::ostream << v` would print it. Strings and integers
// (other than the character types) take a fast path: work descriptions are
// built on every call.
template <typename T>
void append(std::string& out, const T& v) {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, const char*> || std::is_same_v<U, char*>) {
    out.append(v != nullptr ? std::string_view(v) : std::string_view("(null)"));
  } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    out.append(std::string_view(v));
  } else if constexpr (std::is_integral_v<U> && !std::is_same_v<U, bool> &&
                       !std::is_same_v<U, char> && !std::is_same_v<U, signed char> &&
                       !std::is_same_v<U, unsigned char>) {
    char buf[24];
    const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
    out.append(buf, end);
  } else {
    std::ostringstream os;
    os << v;
    out.append(os.str());
  }
}

template <typename... Args>
std::string concat(const Args&... args) {
  std::string out;
  (append(out, args), ...);
  return out;
}

// How a description names a call's label: " of '<label>'", or nothing for
// an empty label ("allreduce #3 of 'bucket 2'").
inline std::string of_label(const std::string& label) {
  return label.empty() ? std::string() : concat(" of '", label, "'");
}

// The message `e` carries, to quote in another error: Error::message() for
// relaxcc's errors (no kind, rank or location), what() for other standard
// exceptions, "an exception of unknown type" for anything else. `e` is not null.
std::string message_of(const std::exception_ptr& e);
}  // namespace detail

}  // namespace relaxcc

#define RELAXCC_THROW(Type, ...) \
  throw ::relaxcc::Type(::relaxcc::detail::concat(__VA_ARGS__), __FILE__, __LINE__)

#define RELAXCC_ENFORCE(cond, Type, ...)                          \
  do {                                                            \
    if (!(cond)) [[unlikely]]                                     \
      RELAXCC_THROW(Type, __VA_ARGS__, ": check failed: " #cond); \
  } while (0)

#define RELAXCC_ENFORCE_OP_(a, b, op, Type, ...)                                             \
  do {                                                                                       \
    const auto& relaxcc_a_ = (a);                                                            \
    const auto& relaxcc_b_ = (b);                                                            \
    if (!(relaxcc_a_ op relaxcc_b_)) [[unlikely]]                                            \
      RELAXCC_THROW(Type, __VA_ARGS__, ": expected " #a " " #op " " #b ", got ", relaxcc_a_, \
                    " vs ", relaxcc_b_);                                                     \
  } while (0)

#define RELAXCC_ENFORCE_EQ(a, b, Type, ...) RELAXCC_ENFORCE_OP_(a, b, ==, Type, __VA_ARGS__)
#define RELAXCC_ENFORCE_NE(a, b, Type, ...) RELAXCC_ENFORCE_OP_(a, b, !=, Type, __VA_ARGS__)
#define RELAXCC_ENFORCE_LT(a, b, Type, ...) RELAXCC_ENFORCE_OP_(a, b, <, Type, __VA_ARGS__)
#define RELAXCC_ENFORCE_LE(a, b, Type, ...) RELAXCC_ENFORCE_OP_(a, b, <=, Type, __VA_ARGS__)
#define RELAXCC_ENFORCE_GT(a, b, Type, ...) RELAXCC_ENFORCE_OP_(a, b, >, Type, __VA_ARGS__)
#define RELAXCC_ENFORCE_GE(a, b, Type, ...) RELAXCC_ENFORCE_OP_(a, b, >=, Type, __VA_ARGS__)
