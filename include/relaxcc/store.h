// Store: a key-value store that processes share while they start (the
// rendezvous exchanges worker addresses through it), shaped as c10d's Store;
// TcpStore: its TCP implementation, shaped as c10d's TCPStore.
//
// Keys are strings; values are byte strings. Every call is bounded by a
// timeout: the store's timeout() unless the call takes its own. A failure is
// a typed error naming the store's address and the key: Timeout when a wait
// or the connection ran past its timeout, CommunicationError when the
// connection failed, InvalidArgument for a request the store refuses (add on a
// value that is not an integer, a message over the size limit).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace relaxcc {

class Store {
 public:
  explicit Store(std::chrono::milliseconds timeout) : timeout_ms_(timeout.count()) {}
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Stores `value` under `key`, replacing any value, and wakes the calls
  // waiting for `key`.
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // The value of `key`, waiting for it to be set until `timeout`; Timeout
  // naming the key when it is not set by then.
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  std::vector<uint8_t> get(const std::string& key) { return get(key, timeout()); }
  // Adds `delta` to the integer stored under `key` (decimal text, as c10d
  // stores it; a missing key counts as 0) and returns the new value, atomically
  // with respect to every other call. InvalidArgument when the value stored is
  // not a decimal int64 or the sum overflows.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Atomically: when the value of `key` equals `expected` (an empty `expected`
  // matches a missing key), stores `desired`. Returns the value stored under
  // `key` after the call: `desired` when it was stored, else the value found
  // (empty for a missing key; c10d returns `expected` there).
  virtual std::vector<uint8_t> compare_set(const std::string& key,
                                           const std::vector<uint8_t>& expected,
                                           const std::vector<uint8_t>& desired) = 0;
  // Waits until every key of `keys` is set, until `timeout`: Timeout naming
  // the keys still missing.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  // Whether every key of `keys` is set, without waiting.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // The number of keys set.
  virtual int64_t num_keys() = 0;
  // Removes `key`; whether it was set.
  virtual bool delete_key(const std::string& key) = 0;
  // Where the store lives, for messages ("host:port" for a TcpStore).
  virtual std::string address() const = 0;
  // Whether this process serves the store: when it ends, the store ends
  // for every process.
  virtual bool is_server() const { return false; }

  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(timeout_ms_.load(std::memory_order_relaxed));
  }
  void set_timeout(std::chrono::milliseconds timeout) {
    timeout_ms_.store(timeout.count(), std::memory_order_relaxed);
  }

 private:
  std::atomic<int64_t> timeout_ms_;
};

struct TcpStoreOptions {
  // The address clients connect to (a name, an IPv4 or an IPv6 address).
  std::string host = "127.0.0.1";
  // The server's port; 0 with is_server picks a free one (TcpStore::port()).
  uint16_t port = 0;
  // This process serves the store: a server thread listening on every
  // interface (as c10d's TCPStore), and a client connected to it.
  bool is_server = false;
  // Connecting (with retries while the server is not up yet) and every call.
  std::chrono::milliseconds timeout{300000};
  // The largest message either side accepts (a key and a value with their
  // framing). The server closes a connection that announces a larger one.
  size_t max_message_bytes = size_t{64} << 20;
};

namespace store_detail {
class TcpStoreServer;
}

// The server is a thread of the serving process: one epoll loop serves every
// client (no thread per client); a get or wait that cannot be answered yet is
// parked on its keys and answered when they are set or when its timeout
// expires, so clients never poll. The wire format (src/rendezvous/wire.h) is
// length-prefixed, versioned and checksummed; the server answers a bad message
// with an error frame where it can, logs it and closes that connection, and
// keeps serving the others.
//
// A get or wait throws Timeout at its timeout (the server answers then; a
// server that does not answer at all gets 0.25 s more); every other call
// has the store's timeout. A call that failed or timed out closes the
// connection, and the next call connects again. A TcpStore object is safe
// to use from several threads: its calls take turns on its one connection,
// so a parked get holds up the object's other calls (wait in parallel on
// separate TcpStore objects).
class TcpStore : public Store {
 public:
  // Serves the store when options.is_server, then connects to it, retrying
  // until options.timeout: Timeout naming host:port when no server answers.
  explicit TcpStore(TcpStoreOptions options);
  // Serves the store when this process can bind options.host:options.port
  // (an address of this machine, a port nobody listens on yet), else
  // connects to the server that holds it. Of several processes that try at
  // once, exactly one serves.
  static std::unique_ptr<TcpStore> serve_or_connect(TcpStoreOptions options);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  using Store::get;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::vector<uint8_t> compare_set(const std::string& key, const std::vector<uint8_t>& expected,
                                   const std::vector<uint8_t>& desired) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t num_keys() override;
  bool delete_key(const std::string& key) override;
  std::string address() const override;

  const std::string& host() const { return options_.host; }
  // The server's port (the one picked when options.port was 0).
  uint16_t port() const { return options_.port; }
  bool is_server() const override { return server_ != nullptr; }

 private:
  struct Reply;
  TcpStore(TcpStoreOptions options, std::unique_ptr<store_detail::TcpStoreServer> server);
  // Sends one request and returns the server's answer, reconnecting first
  // when the connection was closed; throws on transport failure, timeout or
  // a refused request. `what` names the call and its key for messages.
  Reply call(uint16_t op, const std::vector<std::string>& fields, const std::string& what,
             std::chrono::milliseconds server_wait);
  void connect_locked(std::chrono::steady_clock::time_point deadline);
  void close_locked();

  TcpStoreOptions options_;
  std::unique_ptr<store_detail::TcpStoreServer> server_;
  std::mutex mu_;
  int fd_ = -1;
};

}  // namespace relaxcc
