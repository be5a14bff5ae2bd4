#include "src/rendezvous/tcp_store_server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <limits>
#include <vector>

#include "relaxcc/errors.h"
#include "relaxcc/logging.h"
#include "src/rendezvous/socket.h"

namespace relaxcc::store_detail {

using store_wire::Op;
using store_wire::Status;

namespace {
constexpr uint64_t kListenId = 0;
constexpr uint64_t kWakeId = 1;
// Longest wait a request may ask for, so that deadlines do not overflow.
constexpr uint64_t kMaxWaitMs = uint64_t{1} << 40;
constexpr size_t kReadChunk = 64 << 10;
}  // namespace

std::unique_ptr<TcpStoreServer> TcpStoreServer::start(const std::string& host, uint16_t port,
                                                      size_t max_message_bytes, bool may_be_taken) {
  const std::string address = join_host_port(host.empty() ? "*" : host, port);
  int err = 0;
  const int listen_fd = listen_on(host, port, err);
  if (listen_fd < 0) {
    if (may_be_taken && (err == EADDRINUSE || err == EADDRNOTAVAIL)) return nullptr;
    RELAXCC_THROW(CommunicationError, "store server: cannot listen on ", address, ": ",
                  errno_text(err));
  }
  const int wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  const int epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd < 0 || epoll_fd < 0) {
    const int e = errno;
    ::close(listen_fd);
    if (wake_fd >= 0) ::close(wake_fd);
    if (epoll_fd >= 0) ::close(epoll_fd);
    RELAXCC_THROW(CommunicationError, "store server on ", address,
                  ": cannot create its epoll set: ", errno_text(e));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenId;
  ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listen_fd, &ev);
  ev.data.u64 = kWakeId;
  ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, wake_fd, &ev);
  const uint16_t bound = local_port(listen_fd);
  return std::unique_ptr<TcpStoreServer>(
      new TcpStoreServer(listen_fd, wake_fd, epoll_fd,
                         join_host_port(host.empty() ? "*" : host, bound), max_message_bytes));
}

TcpStoreServer::TcpStoreServer(int listen_fd, int wake_fd, int epoll_fd, std::string address,
                               size_t max_message_bytes)
    : listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      epoll_fd_(epoll_fd),
      port_(local_port(listen_fd)),
      address_(std::move(address)),
      max_message_bytes_(max_message_bytes) {
  thread_ = std::thread([this] { run(); });
}

TcpStoreServer::~TcpStoreServer() {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof one);
  thread_.join();
  for (auto& [id, c] : connections_) ::close(c.fd);
  ::close(listen_fd_);
  ::close(wake_fd_);
  ::close(epoll_fd_);
}

void TcpStoreServer::run() {
  // serve() returns when stopped; whatever it throws is logged and the
  // server goes on (its state lives in members).
  for (;;) {
    try {
      serve();
      return;
    } catch (const std::exception& e) {
      RELAXCC_LOG(error, "store server ", address_, ": ", e.what(), "; serving on");
    }
  }
}

void TcpStoreServer::serve() {
  std::vector<epoll_event> events(64);
  std::vector<uint64_t> resume;
  for (;;) {
    const int n =
        ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), next_timeout_ms());
    if (n < 0 && errno != EINTR) {
      RELAXCC_LOG(error, "store server ", address_, ": epoll_wait failed: ", errno_text(errno),
                  "; the server stops");
      return;
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      const uint32_t what = events[i].events;
      if (id == kWakeId) return;
      try {
        if (id == kListenId) {
          accept_all();
          continue;
        }
        if (!connections_.count(id)) continue;  // closed earlier in this batch
        if (what & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) on_readable(id, what);
        if (connections_.count(id) && (what & EPOLLOUT)) on_writable(id);
        if (connections_.count(id)) resume.push_back(id);
      } catch (const std::exception& e) {
        // Nothing a client sends may stop the server: drop that client.
        RELAXCC_LOG(error, "store server ", address_, ": dropping a connection: ", e.what());
        if (id != kListenId && connections_.count(id)) close_connection(id);
      }
    }
    const auto now = Clock::now();
    expire_parked(now);
    expire_draining(now);
    if (accept_paused_until_ != Clock::time_point{} && now >= accept_paused_until_) {
      accept_paused_until_ = {};
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = kListenId;
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
    }
    // Requests that arrived behind a parked one, now answered.
    for (auto& [id, c] : connections_)
      if (!c.parked && !c.closing && c.in.size() >= store_wire::kHeaderBytes) resume.push_back(id);
    for (const uint64_t id : resume) {
      try {
        if (connections_.count(id)) handle_input(id);
      } catch (const std::exception& e) {
        RELAXCC_LOG(error, "store server ", address_, ": dropping a connection: ", e.what());
        if (connections_.count(id)) close_connection(id);
      }
    }
    resume.clear();
  }
}

int TcpStoreServer::next_timeout_ms() const {
  Clock::time_point next = Clock::time_point::max();
  for (const auto& [id, c] : connections_)
    if (c.parked) next = std::min(next, c.deadline);
  for (const auto& [id, c] : connections_)
    if (c.drain_until != Clock::time_point{}) next = std::min(next, c.drain_until);
  if (accept_paused_until_ != Clock::time_point{}) next = std::min(next, accept_paused_until_);
  if (next == Clock::time_point::max()) return -1;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

void TcpStoreServer::accept_all() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // Out of descriptors or memory: stop accepting for a moment rather
      // than spin on a listening socket that stays readable.
      RELAXCC_LOG(error, "store server ", address_, ": accept failed: ", errno_text(errno),
                  "; accepting again in 100 ms");
      epoll_event ev{};
      ev.data.u64 = kListenId;
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
      accept_paused_until_ = Clock::now() + std::chrono::milliseconds(100);
      return;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const uint64_t id = next_id_++;
    Connection& c = connections_[id];
    c.fd = fd;
    c.peer = peer_text(fd);
    c.events = EPOLLIN | EPOLLRDHUP;
    epoll_event ev{};
    ev.events = c.events;
    ev.data.u64 = id;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
}

void TcpStoreServer::on_readable(uint64_t id, uint32_t events) {
  for (;;) {
    auto it = connections_.find(id);
    if (it == connections_.end()) return;
    Connection& c = it->second;
    if (c.drain_until != Clock::time_point{}) {
      char sink[4096];
      const ssize_t r = ::recv(c.fd, sink, sizeof sink, 0);
      if (r > 0 || (r < 0 && errno == EINTR)) continue;
      if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) close_connection(id);
      return;
    }
    if (c.parked || c.closing) {
      // No reads now: only a hang-up matters. A client gives up a parked
      // call by closing its connection.
      if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) close_connection(id);
      return;
    }
    char buf[kReadChunk];
    const ssize_t r = ::recv(c.fd, buf, sizeof buf, 0);
    if (r == 0) {
      close_connection(id);
      return;
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) close_connection(id);
      return;
    }
    c.in.append(buf, static_cast<size_t>(r));
    handle_input(id);
  }
}

void TcpStoreServer::on_writable(uint64_t id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  Connection& c = it->second;
  while (!c.out.empty()) {
    const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      c.out.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    close_connection(id);
    return;
  }
  if (c.out.empty() && c.closing && c.drain_until == Clock::time_point{}) {
    ::shutdown(c.fd, SHUT_WR);
    c.drain_until = Clock::now() + std::chrono::seconds(1);
  }
  update_interest(id);
}

void TcpStoreServer::update_interest(uint64_t id) {
  Connection& c = connections_.at(id);
  uint32_t want = EPOLLRDHUP;
  if ((!c.parked && !c.closing) || c.drain_until != Clock::time_point{}) want |= EPOLLIN;
  if (!c.out.empty()) want |= EPOLLOUT;
  if (want == c.events) return;
  c.events = want;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = id;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
}

void TcpStoreServer::handle_input(uint64_t id) {
  for (;;) {
    auto it = connections_.find(id);
    if (it == connections_.end()) return;
    Connection& c = it->second;
    if (c.parked || c.closing || c.in.size() < store_wire::kHeaderBytes) return;
    std::string error;
    const auto header = store_wire::parse_header(c.in.data(), max_message_bytes_, error);
    if (!header) {
      reject(id, error, true);
      return;
    }
    const size_t total = store_wire::kHeaderBytes + header->body_bytes;
    if (c.in.size() < total) return;
    std::vector<std::string> fields;
    const std::string_view body(c.in.data() + store_wire::kHeaderBytes, header->body_bytes);
    if (!store_wire::parse_body(*header, body, fields, error)) {
      reject(id, error, true);
      return;
    }
    const char* name = store_wire::op_name(header->code);
    if (name == nullptr) {
      reject(id, detail::concat("unknown request code ", header->code), true);
      return;
    }
    const Op op = static_cast<Op>(header->code);
    const auto [lo, hi] = store_wire::op_fields(op);
    if (fields.size() < lo || fields.size() > hi) {
      reject(id, detail::concat(name, " with ", fields.size(), " fields"), true);
      return;
    }
    if ((op == Op::get || op == Op::wait) &&
        !store_wire::decode_u64(fields[op == Op::get ? 1 : 0])) {
      reject(id, detail::concat(name, ": the timeout field is not 8 bytes"), true);
      return;
    }
    if (op == Op::add && !store_wire::decode_u64(fields[1])) {
      reject(id, "add: the delta field is not 8 bytes", true);
      return;
    }
    c.in.erase(0, total);
    handle_request(id, op, fields);
  }
}

void TcpStoreServer::handle_request(uint64_t id, Op op, std::vector<std::string>& fields) {
  auto park = [&](std::vector<std::string> keys, uint64_t timeout_ms) {
    Connection& c = connections_.at(id);
    c.parked = true;
    c.parked_op = op;
    c.parked_keys = std::move(keys);
    c.deadline = Clock::now() + std::chrono::milliseconds(std::min(timeout_ms, kMaxWaitMs));
    if (!try_answer(id)) update_interest(id);
  };
  switch (op) {
    case Op::set: {
      data_[fields[0]] = std::move(fields[1]);
      reply(id, Status::ok, {});
      key_set(fields[0]);
      return;
    }
    case Op::get:
      park({fields[0]}, *store_wire::decode_u64(fields[1]));
      return;
    case Op::wait:
      park(std::vector<std::string>(fields.begin() + 1, fields.end()),
           *store_wire::decode_u64(fields[0]));
      return;
    case Op::add: {
      const auto delta = static_cast<int64_t>(*store_wire::decode_u64(fields[1]));
      int64_t value = 0;
      auto found = data_.find(fields[0]);
      if (found != data_.end()) {
        const std::string& text = found->second;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
          reply(id, Status::invalid,
                {detail::concat("add(", store_wire::quote(fields[0]), ", ", delta,
                                "): the value stored is not a decimal integer: ",
                                store_wire::quote(text.substr(0, 64)))});
          return;
        }
      }
      int64_t sum = 0;
      if (__builtin_add_overflow(value, delta, &sum)) {
        reply(id, Status::invalid,
              {detail::concat("add(", store_wire::quote(fields[0]), ", ", delta, "): ", value,
                              " + ", delta, " overflows int64")});
        return;
      }
      data_[fields[0]] = std::to_string(sum);
      reply(id, Status::ok, {store_wire::encode_u64(static_cast<uint64_t>(sum))});
      key_set(fields[0]);
      return;
    }
    case Op::compare_set: {
      auto found = data_.find(fields[0]);
      if (found == data_.end()) {
        if (!fields[1].empty()) {
          reply(id, Status::ok, {std::string()});
          return;
        }
        data_[fields[0]] = fields[2];
        reply(id, Status::ok, {fields[2]});
        key_set(fields[0]);
        return;
      }
      if (found->second == fields[1]) found->second = fields[2];
      reply(id, Status::ok, {found->second});
      return;
    }
    case Op::check: {
      const bool all = std::all_of(fields.begin(), fields.end(),
                                   [&](const std::string& k) { return data_.count(k) != 0; });
      reply(id, Status::ok, {store_wire::encode_u64(all ? 1 : 0)});
      return;
    }
    case Op::num_keys:
      reply(id, Status::ok, {store_wire::encode_u64(data_.size())});
      return;
    case Op::delete_key:
      reply(id, Status::ok, {store_wire::encode_u64(data_.erase(fields[0]))});
      return;
  }
}

bool TcpStoreServer::try_answer(uint64_t id) {
  Connection& c = connections_.at(id);
  std::vector<std::string> missing;
  for (const auto& k : c.parked_keys)
    if (!data_.count(k)) missing.push_back(k);
  if (!missing.empty()) {
    for (const auto& k : missing) watchers_[k].insert(id);
    return false;
  }
  const bool is_get = c.parked_op == Op::get;
  const std::string value = is_get ? data_.at(c.parked_keys.front()) : std::string();
  unpark(id);
  if (is_get) {
    reply(id, Status::ok, {value});
  } else {
    reply(id, Status::ok, {});
  }
  return true;
}

void TcpStoreServer::unpark(uint64_t id) {
  Connection& c = connections_.at(id);
  for (const auto& k : c.parked_keys) {
    auto w = watchers_.find(k);
    if (w == watchers_.end()) continue;
    w->second.erase(id);
    if (w->second.empty()) watchers_.erase(w);
  }
  c.parked = false;
  c.parked_keys.clear();
  update_interest(id);
}

void TcpStoreServer::key_set(const std::string& key) {
  auto w = watchers_.find(key);
  if (w == watchers_.end()) return;
  const std::set<uint64_t> ids = std::move(w->second);
  watchers_.erase(w);
  for (const uint64_t id : ids)
    if (connections_.count(id) && connections_.at(id).parked) try_answer(id);
}

void TcpStoreServer::expire_parked(Clock::time_point now) {
  std::vector<uint64_t> expired;
  for (const auto& [id, c] : connections_)
    if (c.parked && c.deadline <= now) expired.push_back(id);
  for (const uint64_t id : expired) {
    std::vector<std::string> missing;
    for (const auto& k : connections_.at(id).parked_keys)
      if (!data_.count(k)) missing.push_back(k);
    unpark(id);
    reply(id, Status::timeout, missing);
  }
}

void TcpStoreServer::expire_draining(Clock::time_point now) {
  std::vector<uint64_t> expired;
  for (const auto& [id, c] : connections_)
    if (c.drain_until != Clock::time_point{} && c.drain_until <= now) expired.push_back(id);
  for (const uint64_t id : expired) close_connection(id);
}

void TcpStoreServer::reply(uint64_t id, Status status, const std::vector<std::string>& fields) {
  Connection& c = connections_.at(id);
  c.out += store_wire::encode(static_cast<uint16_t>(status), fields);
  on_writable(id);
}

void TcpStoreServer::reject(uint64_t id, const std::string& reason, bool answer) {
  Connection& c = connections_.at(id);
  RELAXCC_LOG(error, "store server ", address_, ": closing the connection from ", c.peer, ": ",
              reason);
  c.in.clear();
  c.closing = true;
  if (answer) {
    c.out += store_wire::encode(static_cast<uint16_t>(Status::protocol_error), {reason});
  }
  on_writable(id);
}

void TcpStoreServer::close_connection(uint64_t id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  if (it->second.parked) unpark(id);
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second.fd, nullptr);
  ::close(it->second.fd);
  connections_.erase(id);
}

}  // namespace relaxcc::store_detail
