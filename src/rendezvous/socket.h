// TCP socket helpers of the store: connecting with retries until a deadline,
// reads and writes bounded by a deadline, listening sockets.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace relaxcc::store_detail {

using Clock = std::chrono::steady_clock;

// now + `timeout`, saturating: a timeout of years (milliseconds::max())
// waits that long rather than overflow. A negative timeout is now.
Clock::time_point deadline_after(std::chrono::milliseconds timeout);

// "host:port", with brackets around an IPv6 host.
std::string join_host_port(const std::string& host, uint16_t port);
// strerror's text for `err`, with its name's number: "Connection refused (errno 111)".
std::string errno_text(int err);
// The numeric address of a connected or bound socket: "10.0.0.1:5000".
std::string sockaddr_text(const sockaddr* sa);
std::string peer_text(int fd);

// Connects to host:port, retrying while the name does not resolve or the
// server refuses or cannot be reached, until `deadline`. Returns a
// non-blocking socket with TCP_NODELAY; throws Timeout naming host:port and
// the last error. Resolving a name (getaddrinfo) blocks as the system's
// resolver does, outside the deadline; numeric addresses never wait.
int connect_until(const std::string& host, uint16_t port, Clock::time_point deadline);

enum class IoResult { ok, timeout, closed, error };
// Writes all of `data` (send with MSG_NOSIGNAL, poll while the socket is
// full) before `deadline`. On error, `err` holds errno.
IoResult write_all(int fd, std::string_view data, Clock::time_point deadline, int& err);
// Reads exactly `n` bytes before `deadline`; closed when the peer closed first.
IoResult read_exact(int fd, char* out, size_t n, Clock::time_point deadline, int& err);

// A non-blocking listening socket on host:port (an empty host: every
// interface, IPv6 and IPv4). Returns -1 with errno in `err` when no address
// could be bound (EADDRINUSE: someone listens there; EADDRNOTAVAIL: host is
// not an address of this machine).
int listen_on(const std::string& host, uint16_t port, int& err);
// The port a bound socket holds.
uint16_t local_port(int fd);

}  // namespace relaxcc::store_detail
