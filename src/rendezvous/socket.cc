#include "src/rendezvous/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "relaxcc/errors.h"

namespace relaxcc::store_detail {
namespace {

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

void set_nonblocking(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
}

// Waits for `events` on fd until deadline: 1 ready, 0 timeout, -1 error.
int poll_until(int fd, short events, Clock::time_point deadline, int& err) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, remaining_ms(deadline));
    if (r > 0) return 1;
    if (r == 0) {
      if (Clock::now() >= deadline) return 0;
      continue;
    }
    if (errno == EINTR) continue;
    err = errno;
    return -1;
  }
}

// One non-blocking connect to `ai` bounded by deadline. Returns the socket
// or -1 with `err` set (ETIMEDOUT at the deadline).
int connect_once(const addrinfo* ai, Clock::time_point deadline, int& err) {
  const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) {
    err = errno;
    return -1;
  }
  set_nonblocking(fd);
  if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      err = errno;
      ::close(fd);
      return -1;
    }
    const int ready = poll_until(fd, POLLOUT, deadline, err);
    int so_error = 0;
    socklen_t len = sizeof so_error;
    if (ready <= 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0 ||
        so_error != 0) {
      if (ready == 0) err = ETIMEDOUT;
      if (ready > 0) err = so_error != 0 ? so_error : errno;
      ::close(fd);
      return -1;
    }
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  // 2^40 ms: 35 years, far from the clock's overflow.
  const auto capped = std::clamp(timeout, std::chrono::milliseconds(0),
                                 std::chrono::milliseconds(int64_t{1} << 40));
  return Clock::now() + capped;
}

std::string join_host_port(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return detail::concat("[", host, "]:", port);
  return detail::concat(host, ":", port);
}

std::string errno_text(int err) {
  char buf[128];
  const char* text = ::strerror_r(err, buf, sizeof buf);
  return detail::concat(text, " (errno ", err, ")");
}

std::string sockaddr_text(const sockaddr* sa) {
  char ip[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &in->sin_addr, ip, sizeof ip);
    port = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {  // an IPv4 client of a dual-stack socket
      ::inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], ip, sizeof ip);
    } else {
      ::inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof ip);
    }
    port = ntohs(in6->sin6_port);
  }
  return join_host_port(ip, port);
}

std::string peer_text(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "an unknown peer";
  return sockaddr_text(reinterpret_cast<const sockaddr*>(&ss));
}

int connect_until(const std::string& host, uint16_t port, Clock::time_point deadline) {
  const std::string address = join_host_port(host, port);
  const std::string service = std::to_string(port);
  const auto start = Clock::now();
  std::string last_error = "no attempt made";
  auto backoff = std::chrono::milliseconds(10);
  int attempts = 0;
  for (;;) {
    ++attempts;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* list = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
    if (rc != 0) {
      last_error = detail::concat("cannot resolve ", host, ": ", ::gai_strerror(rc));
    } else {
      for (const addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
        int err = 0;
        const int fd = connect_once(ai, deadline, err);
        if (fd >= 0) {
          ::freeaddrinfo(list);
          return fd;
        }
        last_error = detail::concat(sockaddr_text(ai->ai_addr), ": ", errno_text(err));
      }
      ::freeaddrinfo(list);
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(250));
  }
  const auto waited =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  RELAXCC_THROW(Timeout, "could not connect to the store at ", address, " within ", waited, " ms (",
                attempts, " attempts; last error: ", last_error, ")");
}

IoResult write_all(int fd, std::string_view data, Clock::time_point deadline, int& err) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const int r = poll_until(fd, POLLOUT, deadline, err);
      if (r == 0) return IoResult::timeout;
      if (r < 0) return IoResult::error;
      continue;
    }
    err = errno;
    return err == EPIPE || err == ECONNRESET ? IoResult::closed : IoResult::error;
  }
  return IoResult::ok;
}

IoResult read_exact(int fd, char* out, size_t n, Clock::time_point deadline, int& err) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::recv(fd, out + done, n - done, 0);
    if (r > 0) {
      done += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return IoResult::closed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const int p = poll_until(fd, POLLIN, deadline, err);
      if (p == 0) return IoResult::timeout;
      if (p < 0) return IoResult::error;
      continue;
    }
    err = errno;
    return err == ECONNRESET ? IoResult::closed : IoResult::error;
  }
  return IoResult::ok;
}

int listen_on(const std::string& host, uint16_t port, int& err) {
  auto try_bind = [&](const sockaddr* sa, socklen_t len, bool dual_stack) {
    const int fd = ::socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      err = errno;
      return -1;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (dual_stack) {
      const int zero = 0;
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    }
    if (::bind(fd, sa, len) != 0 || ::listen(fd, 1024) != 0) {
      err = errno;
      ::close(fd);
      return -1;
    }
    return fd;
  };
  if (host.empty()) {
    sockaddr_in6 in6{};
    in6.sin6_family = AF_INET6;
    in6.sin6_addr = in6addr_any;
    in6.sin6_port = htons(port);
    const int fd = try_bind(reinterpret_cast<const sockaddr*>(&in6), sizeof in6, true);
    if (fd >= 0 || err == EADDRINUSE) return fd;
    sockaddr_in in{};  // no IPv6 here: IPv4 only
    in.sin_family = AF_INET;
    in.sin_addr.s_addr = htonl(INADDR_ANY);
    in.sin_port = htons(port);
    return try_bind(reinterpret_cast<const sockaddr*>(&in), sizeof in, false);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  if (::getaddrinfo(host.c_str(), service.c_str(), &hints, &list) != 0) {
    err = EADDRNOTAVAIL;
    return -1;
  }
  int fd = -1;
  err = EADDRNOTAVAIL;
  for (const addrinfo* ai = list; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = try_bind(ai->ai_addr, ai->ai_addrlen, false);
    if (fd < 0 && err == EADDRINUSE) break;
  }
  ::freeaddrinfo(list);
  return fd;
}

uint16_t local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
  return ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
}

}  // namespace relaxcc::store_detail
