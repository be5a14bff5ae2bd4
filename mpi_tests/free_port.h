// A TCP port for a server that a test's child processes start themselves.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include <stdexcept>

namespace relaxcc::test {

// A port nobody listens on now, below Linux's ephemeral range (32768 and
// up), so that no outgoing connection of another program takes it before
// the test's server binds it; random per process, so that tests running at
// once rarely pick the same one. Throws after 1000 tries.
inline uint16_t free_port() {
  static std::mt19937 rng(static_cast<unsigned>(::getpid()));
  for (int tries = 0; tries < 1000; ++tries) {
    const auto port = static_cast<uint16_t>(20000 + rng() % 12000);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) throw std::runtime_error("free_port: socket() failed");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(port);
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (free) return port;
  }
  throw std::runtime_error("free_port: no free port in 20000-31999 after 1000 tries");
}

}  // namespace relaxcc::test
