#include "src/engine/udp_channel.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "relaxcc/errors.h"
#include "relaxcc/logging.h"

namespace relaxcc::engine {

namespace {

constexpr uint32_t kMagic = 0x56494c52;  // "RLIV"
// Times a leaving or ack beat is sent (a lost one would leave a peer timing
// a rank that left, or the leaving rank waiting until its deadline).
constexpr int kControlCopies = 3;

struct Datagram {
  uint32_t magic;
  uint32_t from;
  uint64_t token;
  uint64_t beat;
};

bool is_beat(uint64_t v) {
  return v == static_cast<uint64_t>(Beat::alive) || v == static_cast<uint64_t>(Beat::leaving) ||
         v == static_cast<uint64_t>(Beat::ack);
}

}  // namespace

UdpSocket::UdpSocket() {
  fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  RELAXCC_ENFORCE(fd_ >= 0, CommunicationError,
                  "cannot open the UDP socket of heartbeats: ", std::strerror(errno));
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(any);
  if (::bind(fd_, reinterpret_cast<const sockaddr*>(&any), sizeof(any)) != 0 ||
      ::getsockname(fd_, reinterpret_cast<sockaddr*>(&any), &len) != 0) {
    const int e = errno;
    ::close(fd_);
    RELAXCC_THROW(CommunicationError,
                  "cannot bind the UDP socket of heartbeats: ", std::strerror(e));
  }
  address_.port = ntohs(any.sin_port);
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (const ifaddrs* i = list; i != nullptr && address_.hosts.size() < kMaxHosts;
         i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
      if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
      address_.hosts.push_back(reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
    }
    ::freeifaddrs(list);
  }
}

UdpSocket::~UdpSocket() {
  if (fd_ >= 0) ::close(fd_);
}

UdpChannel::UdpChannel(std::shared_ptr<UdpSocket> socket, int rank, const std::vector<Peer>& peers,
                       uint64_t token)
    : socket_(std::move(socket)),
      rank_(rank),
      token_(token),
      to_(peers.size()),
      ignored_(peers.size(), false) {
  for (size_t r = 0; r < peers.size(); ++r) {
    if (static_cast<int>(r) == rank) continue;
    const Peer& p = peers[r];
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(p.address.port);
    if (p.same_namespace) {
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      to_[r].push_back(a);
      continue;
    }
    for (uint32_t host : p.address.hosts) {
      a.sin_addr.s_addr = host;
      to_[r].push_back(a);
    }
  }
}

void UdpChannel::send(int rank, Beat beat) {
  if (closed_) return;
  const Datagram d{kMagic, static_cast<uint32_t>(rank_), token_, static_cast<uint64_t>(beat)};
  const int copies = beat == Beat::alive ? 1 : kControlCopies;
  for (int c = 0; c < copies; ++c)
    for (const sockaddr_in& a : to_[static_cast<size_t>(rank)]) {
      // Non-blocking: a full socket buffer drops the beat (EAGAIN), as an
      // unreachable address does; the next period sends another.
      if (::sendto(socket_->fd(), &d, sizeof(d), MSG_DONTWAIT | MSG_NOSIGNAL,
                   reinterpret_cast<const sockaddr*>(&a), sizeof(a)) < 0 &&
          errno != EAGAIN && errno != EWOULDBLOCK)
        RELAXCC_LOG(debug, "cannot send a heartbeat to rank ", rank, ": ", std::strerror(errno));
    }
}

void UdpChannel::take(const std::function<void(int, Beat)>& on_beat) {
  if (closed_) return;
  for (;;) {
    Datagram d{};
    const ssize_t n = ::recv(socket_->fd(), &d, sizeof(d), MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0) {
      if (errno == EINTR) continue;
      // EAGAIN: none left. Anything else (an ICMP error of an earlier
      // send, reported here) is not a beat either.
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      continue;
    }
    if (n != static_cast<ssize_t>(sizeof(d)) || d.magic != kMagic || d.token != token_ ||
        d.from >= ignored_.size() || static_cast<int>(d.from) == rank_ || !is_beat(d.beat) ||
        ignored_[d.from])
      continue;
    on_beat(static_cast<int>(d.from), static_cast<Beat>(d.beat));
  }
}

void UdpChannel::ignore(int rank) {
  ignored_[static_cast<size_t>(rank)] = true;
}

bool UdpChannel::close(Clock::time_point) {
  closed_ = true;
  return true;
}

}  // namespace relaxcc::engine
