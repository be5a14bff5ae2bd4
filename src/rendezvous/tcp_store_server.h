// The TcpStore server: one thread, one epoll loop over the listening socket,
// every client connection and an eventfd that stops it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>

#include "src/rendezvous/wire.h"

namespace relaxcc::store_detail {

class TcpStoreServer {
 public:
  // Listens on host:port (an empty host: every interface) and starts the
  // serving thread. Returns nullptr when the address is taken or not one of
  // this machine's and `may_be_taken`; otherwise such a failure, and any
  // other, throws CommunicationError naming the address.
  static std::unique_ptr<TcpStoreServer> start(const std::string& host, uint16_t port,
                                               size_t max_message_bytes, bool may_be_taken);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  uint16_t port() const { return port_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Connection {
    int fd = -1;
    std::string peer;
    std::string in;        // bytes received, not yet handled
    std::string out;       // bytes to send
    bool closing = false;  // close once `out` is sent; handle nothing more
    // Set once a closing connection's `out` is sent: its write side is shut
    // and its input discarded until the peer closes or this time, so that
    // the peer reads the error frame rather than a reset.
    Clock::time_point drain_until{};
    // The parked get or wait: its op, its keys, its deadline.
    bool parked = false;
    store_wire::Op parked_op = store_wire::Op::get;
    std::vector<std::string> parked_keys;
    Clock::time_point deadline;
    uint32_t events = 0;  // the epoll interest registered
  };

  TcpStoreServer(int listen_fd, int wake_fd, int epoll_fd, std::string address,
                 size_t max_message_bytes);
  void run();
  void serve();
  void accept_all();
  // `events`: what epoll reported.
  void on_readable(uint64_t id, uint32_t events);
  void on_writable(uint64_t id);
  // Handles every complete request in the connection's input.
  void handle_input(uint64_t id);
  void handle_request(uint64_t id, store_wire::Op op, std::vector<std::string>& fields);
  void reply(uint64_t id, store_wire::Status status, const std::vector<std::string>& fields);
  // Logs `reason`, sends a protocol_error frame when `answer`, and closes
  // the connection once that frame is out.
  void reject(uint64_t id, const std::string& reason, bool answer);
  void close_connection(uint64_t id);
  void update_interest(uint64_t id);
  // Keys set or created: answers the parked calls that now have all keys.
  void key_set(const std::string& key);
  // Answers a parked call whose keys are all set; false when some are missing.
  bool try_answer(uint64_t id);
  void unpark(uint64_t id);
  void expire_parked(Clock::time_point now);
  void expire_draining(Clock::time_point now);
  int next_timeout_ms() const;

  int listen_fd_;
  int wake_fd_;
  int epoll_fd_;
  uint16_t port_ = 0;
  std::string address_;
  size_t max_message_bytes_;
  std::thread thread_;
  uint64_t next_id_ = 2;  // 0: the listening socket, 1: the wake eventfd
  std::unordered_map<uint64_t, Connection> connections_;
  std::unordered_map<std::string, std::string> data_;
  // key -> the parked connections waiting for it
  std::unordered_map<std::string, std::set<uint64_t>> watchers_;
  Clock::time_point accept_paused_until_{};
};

}  // namespace relaxcc::store_detail
