// UdpChannel: heartbeats over one non-blocking UDP socket per endpoint set
// (liveness_channel.h), so that they never queue behind the data in a
// transport's connection (a TCP socket's buffers and a wing's send queue
// can hold seconds of bulk transfer on a slow link). A beat is one datagram:
// a magic word, the set's token (every member computes the same one from
// what the creation exchanged: strays from other sets and jobs are
// dropped), the sender's rank and the beat. Datagrams may be lost: the
// heartbeat sends `alive` every timeout / 4, so a verdict needs about four
// lost in a row; leaving and ack go three times.
//
// Addresses: a rank publishes its socket's port and this host's IPv4
// addresses (UdpSocket::address(), carried by a wing's creation handshake);
// beats to a peer go to each of its addresses (the loopback one for a peer
// in this network namespace).
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/engine/liveness_channel.h"

namespace relaxcc::engine {

// Where a rank's liveness socket listens: a port and IPv4 addresses
// (network byte order).
struct UdpAddress {
  uint16_t port = 0;
  std::vector<uint32_t> hosts;
};

// A bound, non-blocking UDP socket (any interface, a port the kernel
// picks). Throws CommunicationError when the kernel refuses.
class UdpSocket {
 public:
  UdpSocket();
  ~UdpSocket();
  UdpSocket(const UdpSocket&) = delete;
  UdpSocket& operator=(const UdpSocket&) = delete;
  int fd() const { return fd_; }
  // Its port and the IPv4 addresses of this host's interfaces that are up
  // (loopback excluded; at most kMaxHosts).
  const UdpAddress& address() const { return address_; }
  static constexpr size_t kMaxHosts = 8;

 private:
  int fd_ = -1;
  UdpAddress address_;
};

class UdpChannel final : public LivenessChannel {
 public:
  // For rank `rank` of `peers.size()`: peers[r] is rank r's address and
  // whether it shares this network namespace (then 127.0.0.1 is used);
  // `token` identifies the set.
  struct Peer {
    UdpAddress address;
    bool same_namespace = false;
  };
  UdpChannel(std::shared_ptr<UdpSocket> socket, int rank, const std::vector<Peer>& peers,
             uint64_t token);

  void send(int rank, Beat beat) override;
  void take(const std::function<void(int, Beat)>& on_beat) override;
  void lost(int) override {}
  void ignore(int rank) override;
  bool close(Clock::time_point deadline) override;

 private:
  const std::shared_ptr<UdpSocket> socket_;
  const int rank_;
  const uint64_t token_;
  std::vector<std::vector<sockaddr_in>> to_;  // per rank: where its beats go
  std::vector<bool> ignored_;
  bool closed_ = false;
};

}  // namespace relaxcc::engine
