#include <unistd.h>

#include <algorithm>

#include "relaxcc/errors.h"
#include "relaxcc/store.h"
#include "src/rendezvous/socket.h"
#include "src/rendezvous/tcp_store_server.h"
#include "src/rendezvous/wire.h"

namespace relaxcc {

using store_detail::Clock;
using store_detail::IoResult;
using store_detail::TcpStoreServer;
using store_wire::Op;
using store_wire::Status;

namespace {

// How long a client waits for the answer to a get or wait beyond the timeout
// it asked the server to keep (the server answers at the timeout itself).
constexpr std::chrono::milliseconds kReplyGrace{250};

std::string to_string(const std::vector<uint8_t>& v) {
  return std::string(v.begin(), v.end());
}
std::vector<uint8_t> to_bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string quote_keys(const std::vector<std::string>& keys) {
  std::string out;
  const size_t shown = std::min<size_t>(keys.size(), 8);
  for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + store_wire::quote(keys[i]);
  if (keys.size() > shown) out += detail::concat(" and ", keys.size() - shown, " more");
  return out;
}

std::unique_ptr<TcpStoreServer> serve_if_asked(const TcpStoreOptions& o) {
  if (!o.is_server) return nullptr;
  return TcpStoreServer::start("", o.port, o.max_message_bytes, false);
}

}  // namespace

struct TcpStore::Reply {
  Status status;
  std::vector<std::string> fields;
};

TcpStore::TcpStore(TcpStoreOptions options) : TcpStore(options, serve_if_asked(options)) {}

TcpStore::TcpStore(TcpStoreOptions options, std::unique_ptr<TcpStoreServer> server)
    : Store(options.timeout), options_(std::move(options)), server_(std::move(server)) {
  RELAXCC_ENFORCE(options_.timeout.count() > 0, InvalidArgument,
                  "TcpStore: the timeout must be positive");
  if (server_) options_.port = server_->port();
  options_.is_server = server_ != nullptr;
  RELAXCC_ENFORCE(options_.port != 0, InvalidArgument, "TcpStore: a client of ", options_.host,
                  " needs the server's port (options.port is 0)");
  std::lock_guard lock(mu_);
  connect_locked(store_detail::deadline_after(timeout()));
}

std::unique_ptr<TcpStore> TcpStore::serve_or_connect(TcpStoreOptions options) {
  RELAXCC_ENFORCE(options.port != 0, InvalidArgument,
                  "TcpStore::serve_or_connect: the processes need a port they all know (port 0)");
  auto server = TcpStoreServer::start(options.host, options.port, options.max_message_bytes, true);
  return std::unique_ptr<TcpStore>(new TcpStore(std::move(options), std::move(server)));
}

TcpStore::~TcpStore() {
  std::lock_guard lock(mu_);
  close_locked();
}

std::string TcpStore::address() const {
  return store_detail::join_host_port(options_.host, options_.port);
}

void TcpStore::connect_locked(Clock::time_point deadline) {
  fd_ = store_detail::connect_until(options_.host, options_.port, deadline);
}

void TcpStore::close_locked() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

TcpStore::Reply TcpStore::call(uint16_t op, const std::vector<std::string>& fields,
                               const std::string& what, std::chrono::milliseconds server_wait) {
  const std::string request = store_wire::encode(op, fields);
  RELAXCC_ENFORCE(request.size() - store_wire::kHeaderBytes <= options_.max_message_bytes,
                  InvalidArgument, "store at ", address(), ": ", what, ": a request of ",
                  request.size() - store_wire::kHeaderBytes, " bytes is over max_message_bytes (",
                  options_.max_message_bytes, ")");
  std::lock_guard lock(mu_);
  const auto start = Clock::now();
  const bool parks = op == static_cast<uint16_t>(Op::get) || op == static_cast<uint16_t>(Op::wait);
  const auto deadline = store_detail::deadline_after(
      parks ? std::min(server_wait, std::chrono::milliseconds::max() - kReplyGrace) + kReplyGrace
            : timeout());
  if (fd_ < 0) connect_locked(deadline);
  int err = 0;
  auto fail = [&](IoResult r, const char* doing) {
    close_locked();
    const auto waited =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    if (r == IoResult::timeout)
      RELAXCC_THROW(Timeout, "store at ", address(), ": ", what, ": no reply within ", waited,
                    " ms");
    if (r == IoResult::closed)
      RELAXCC_THROW(CommunicationError, "store at ", address(), ": ", what,
                    ": the server closed the connection while ", doing);
    RELAXCC_THROW(CommunicationError, "store at ", address(), ": ", what, ": ", doing,
                  " failed: ", store_detail::errno_text(err));
  };
  IoResult r = store_detail::write_all(fd_, request, deadline, err);
  if (r != IoResult::ok) fail(r, "sending the request");
  char head[store_wire::kHeaderBytes];
  r = store_detail::read_exact(fd_, head, sizeof head, deadline, err);
  if (r != IoResult::ok) fail(r, "receiving the reply");
  std::string error;
  const auto header = store_wire::parse_header(head, options_.max_message_bytes, error);
  std::string body;
  Reply reply{};
  if (header) {
    body.resize(header->body_bytes);
    r = store_detail::read_exact(fd_, body.data(), body.size(), deadline, err);
    if (r != IoResult::ok) fail(r, "receiving the reply");
    if (store_wire::parse_body(*header, body, reply.fields, error)) {
      reply.status = static_cast<Status>(header->code);
      switch (reply.status) {
        case Status::ok:
        case Status::timeout:
          return reply;
        case Status::invalid:
          RELAXCC_THROW(InvalidArgument, "store at ", address(), ": ",
                        reply.fields.empty() ? what : reply.fields.front());
        case Status::protocol_error:
          close_locked();
          RELAXCC_THROW(CommunicationError, "store at ", address(), ": ", what,
                        ": the server refused the request: ",
                        reply.fields.empty() ? std::string("(no reason)") : reply.fields.front());
      }
      error = detail::concat("unknown reply code ", header->code);
    }
  }
  close_locked();
  RELAXCC_THROW(CommunicationError, "store at ", address(), ": ", what,
                ": a malformed reply: ", error);
}

namespace {
// The reply's fields, checked against the count the request expects.
const std::vector<std::string>& expect_fields(const std::vector<std::string>& fields, size_t n,
                                              const std::string& address, const std::string& what) {
  if (fields.size() != n)
    RELAXCC_THROW(CommunicationError, "store at ", address, ": ", what, ": a reply of ",
                  fields.size(), " fields, expected ", n);
  return fields;
}

uint64_t expect_u64(const std::vector<std::string>& fields, const std::string& address,
                    const std::string& what) {
  const auto v = store_wire::decode_u64(expect_fields(fields, 1, address, what).front());
  if (!v)
    RELAXCC_THROW(CommunicationError, "store at ", address, ": ", what, ": a malformed integer");
  return *v;
}

std::string timeout_field(std::chrono::milliseconds t) {
  return store_wire::encode_u64(static_cast<uint64_t>(std::max<int64_t>(t.count(), 0)));
}
}  // namespace

void TcpStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  const std::string what = detail::concat("set(", store_wire::quote(key), ")");
  const Reply r = call(static_cast<uint16_t>(Op::set), {key, to_string(value)}, what, {});
  expect_fields(r.fields, 0, address(), what);
}

std::vector<uint8_t> TcpStore::get(const std::string& key, std::chrono::milliseconds t) {
  const std::string what = detail::concat("get(", store_wire::quote(key), ")");
  const Reply r = call(static_cast<uint16_t>(Op::get), {key, timeout_field(t)}, what, t);
  if (r.status == Status::timeout)
    RELAXCC_THROW(Timeout, "store at ", address(), ": ", what, ": the key was not set within ",
                  t.count(), " ms");
  return to_bytes(expect_fields(r.fields, 1, address(), what).front());
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  const std::string what = detail::concat("add(", store_wire::quote(key), ", ", delta, ")");
  const Reply r = call(static_cast<uint16_t>(Op::add),
                       {key, store_wire::encode_u64(static_cast<uint64_t>(delta))}, what, {});
  return static_cast<int64_t>(expect_u64(r.fields, address(), what));
}

std::vector<uint8_t> TcpStore::compare_set(const std::string& key,
                                           const std::vector<uint8_t>& expected,
                                           const std::vector<uint8_t>& desired) {
  const std::string what = detail::concat("compare_set(", store_wire::quote(key), ")");
  const Reply r = call(static_cast<uint16_t>(Op::compare_set),
                       {key, to_string(expected), to_string(desired)}, what, {});
  return to_bytes(expect_fields(r.fields, 1, address(), what).front());
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  if (keys.empty()) return;
  const std::string what = detail::concat("wait(", quote_keys(keys), ")");
  std::vector<std::string> fields{timeout_field(timeout)};
  fields.insert(fields.end(), keys.begin(), keys.end());
  const Reply r = call(static_cast<uint16_t>(Op::wait), fields, what, timeout);
  if (r.status == Status::timeout)
    RELAXCC_THROW(Timeout, "store at ", address(), ": ", what, ": ", quote_keys(r.fields),
                  r.fields.size() == 1 ? " was" : " were", " not set within ", timeout.count(),
                  " ms");
  expect_fields(r.fields, 0, address(), what);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  if (keys.empty()) return true;
  const std::string what = detail::concat("check(", quote_keys(keys), ")");
  const Reply r = call(static_cast<uint16_t>(Op::check), keys, what, {});
  return expect_u64(r.fields, address(), what) != 0;
}

int64_t TcpStore::num_keys() {
  const Reply r = call(static_cast<uint16_t>(Op::num_keys), {}, "num_keys()", {});
  return static_cast<int64_t>(expect_u64(r.fields, address(), "num_keys()"));
}

bool TcpStore::delete_key(const std::string& key) {
  const std::string what = detail::concat("delete_key(", store_wire::quote(key), ")");
  const Reply r = call(static_cast<uint16_t>(Op::delete_key), {key}, what, {});
  return expect_u64(r.fields, address(), what) != 0;
}

}  // namespace relaxcc
