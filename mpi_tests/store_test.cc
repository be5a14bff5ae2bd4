// The rendezvous store and the rendezvous, without MPI. TcpStore's
// semantics run with the server and its clients in this process (each
// client on its own connection, as separate processes would be); the
// rendezvous runs in child processes, each this program re-executed with
// --rendezvous-child and the launcher's variables of its case.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "child_processes.h"
#include "free_port.h"
#include "relaxcc/errors.h"
#include "relaxcc/rendezvous.h"
#include "relaxcc/store.h"
#include "src/rendezvous/wire.h"

extern char** environ;

namespace relaxcc {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using test::free_port;

std::vector<uint8_t> bytes(std::string_view s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

int64_t elapsed_ms(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
}

TcpStoreOptions server_options(milliseconds timeout = milliseconds(10000)) {
  TcpStoreOptions o;
  o.is_server = true;
  o.timeout = timeout;
  return o;
}

TcpStoreOptions client_options(const TcpStore& server, milliseconds timeout = milliseconds(10000)) {
  TcpStoreOptions o;
  o.port = server.port();
  o.timeout = timeout;
  return o;
}

// ---- TcpStore semantics ----------------------------------------------------

TEST(TcpStore, SetGetAddCompareSetCheckDelete) {
  TcpStore server(server_options());
  ASSERT_TRUE(server.is_server());
  ASSERT_NE(server.port(), 0);
  TcpStore client(client_options(server));
  EXPECT_FALSE(client.is_server());
  EXPECT_EQ(client.address(), "127.0.0.1:" + std::to_string(server.port()));

  const std::vector<uint8_t> binary{0, 1, 0xff, 0, 'x', 0};
  client.set("a", binary);
  EXPECT_EQ(server.get("a"), binary);
  client.set("a", bytes("second"));
  EXPECT_EQ(server.get("a"), bytes("second"));
  client.set("empty", {});
  EXPECT_EQ(client.get("empty"), std::vector<uint8_t>{});

  EXPECT_EQ(client.add("n", 5), 5);
  EXPECT_EQ(server.add("n", -7), -2);
  EXPECT_EQ(client.get("n"), bytes("-2"));
  try {
    client.add("a", 1);
    ADD_FAILURE() << "add on a non-integer value";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'a'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a decimal integer"), std::string::npos) << e.what();
  }
  client.set("max", bytes(std::to_string(INT64_MAX)));
  EXPECT_THROW(client.add("max", 1), InvalidArgument);
  EXPECT_EQ(client.add("n", 0), -2);  // the connection survives a refused request

  // compare_set: an empty expected matches a missing key only.
  EXPECT_EQ(client.compare_set("c", bytes("x"), bytes("y")), std::vector<uint8_t>{});
  EXPECT_FALSE(client.check({"c"}));
  EXPECT_EQ(client.compare_set("c", {}, bytes("first")), bytes("first"));
  EXPECT_EQ(client.compare_set("c", {}, bytes("second")), bytes("first"));
  EXPECT_EQ(client.compare_set("c", bytes("wrong"), bytes("second")), bytes("first"));
  EXPECT_EQ(client.compare_set("c", bytes("first"), bytes("second")), bytes("second"));
  EXPECT_EQ(server.get("c"), bytes("second"));

  EXPECT_TRUE(client.check({"a", "n", "c"}));
  EXPECT_FALSE(client.check({"a", "missing"}));
  EXPECT_TRUE(client.check({}));
  EXPECT_EQ(client.num_keys(), 5);  // a, empty, n, max, c
  EXPECT_TRUE(client.delete_key("a"));
  EXPECT_FALSE(client.delete_key("a"));
  EXPECT_FALSE(client.check({"a"}));
  EXPECT_EQ(server.num_keys(), 4);
  client.wait({"n", "c"}, milliseconds(0));  // set already: no waiting

  // A value of 1 MiB, every byte encoding its index.
  std::vector<uint8_t> big(1 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7 + (i >> 8));
  client.set("big", big);
  EXPECT_EQ(server.get("big"), big);
}

TEST(TcpStore, BlockingGetAndWaitAnsweredWhenSet) {
  TcpStore server(server_options());
  TcpStore waiter(client_options(server));
  TcpStore setter(client_options(server));
  std::vector<uint8_t> got;
  int64_t got_after = -1;
  const auto start = Clock::now();
  std::thread t([&] {
    got = waiter.get("k", milliseconds::max());  // "forever": no overflow anywhere
    got_after = elapsed_ms(start);
  });
  std::this_thread::sleep_for(milliseconds(300));
  setter.set("k", bytes("value"));
  const int64_t set_after = elapsed_ms(start);
  t.join();
  EXPECT_EQ(got, bytes("value"));
  // Answered when set: after the set began, and within 1 s of it.
  EXPECT_GE(got_after, 300);
  EXPECT_LE(got_after, set_after + 1000);

  // wait() returns only when every key is set; add creates a key too.
  std::atomic<bool> done{false};
  std::thread w([&] {
    waiter.wait({"x", "y"}, milliseconds(10000));
    done = true;
  });
  setter.set("x", bytes("1"));
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_FALSE(done.load());
  setter.add("y", 1);
  w.join();
  EXPECT_TRUE(done.load());

  // Sixteen clients parked on one key, all answered by one set.
  std::vector<std::unique_ptr<TcpStore>> clients;
  for (int i = 0; i < 16; ++i)
    clients.push_back(std::make_unique<TcpStore>(client_options(server)));
  std::atomic<int> answered{0};
  std::vector<std::thread> threads;
  for (auto& c : clients)
    threads.emplace_back([&, store = c.get()] {
      if (store->get("go", milliseconds(10000)) == bytes("now")) ++answered;
    });
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(answered.load(), 0);
  setter.set("go", bytes("now"));
  for (auto& th : threads) th.join();
  EXPECT_EQ(answered.load(), 16);
}

TEST(TcpStore, ConcurrentAddsAreAtomic) {
  TcpStore server(server_options());
  std::vector<std::thread> threads;
  std::vector<std::vector<int64_t>> seen(8);
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      TcpStore c(client_options(server));
      for (int k = 0; k < 100; ++k) seen[static_cast<size_t>(i)].push_back(c.add("counter", 1));
    });
  for (auto& t : threads) t.join();
  // Every value 1..800 returned exactly once.
  std::set<int64_t> all;
  for (const auto& s : seen) all.insert(s.begin(), s.end());
  EXPECT_EQ(all.size(), 800u);
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), 800);
  EXPECT_EQ(server.get("counter"), bytes("800"));
}

TEST(TcpStore, TimeoutsWithinTheirBounds) {
  TcpStore server(server_options());
  TcpStore client(client_options(server, milliseconds(500)));
  const std::string address = client.address();
  // get uses the store's timeout: Timeout at 500 ms (+1 s allowed).
  auto start = Clock::now();
  try {
    client.get("never");
    ADD_FAILURE() << "get of a key never set returned";
  } catch (const Timeout& e) {
    const int64_t ms = elapsed_ms(start);
    EXPECT_GE(ms, 500);
    EXPECT_LE(ms, 1500);
    EXPECT_NE(std::string(e.what()).find(address), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'never'"), std::string::npos) << e.what();
  }
  // wait names the keys still missing, not those set.
  client.set("present", bytes("1"));
  start = Clock::now();
  try {
    client.wait({"present", "absent"}, milliseconds(300));
    ADD_FAILURE() << "wait for a key never set returned";
  } catch (const Timeout& e) {
    const int64_t ms = elapsed_ms(start);
    EXPECT_GE(ms, 300);
    EXPECT_LE(ms, 1300);
    const std::string what = e.what();
    EXPECT_NE(what.find("'absent' was not set within 300 ms"), std::string::npos) << what;
  }
  // The connection is still usable.
  EXPECT_EQ(client.get("present"), bytes("1"));
}

// A client of host:port with a 700 ms timeout throws Timeout within 700 ms
// (+1 s allowed), its message containing each of `parts`.
void expect_connect_timeout(const std::string& host, uint16_t port,
                            const std::vector<std::string>& parts) {
  TcpStoreOptions o;
  o.host = host;
  o.port = port;
  o.timeout = milliseconds(700);
  const auto start = Clock::now();
  try {
    TcpStore client(o);
    ADD_FAILURE() << "connected to " << host << ":" << port;
  } catch (const Timeout& e) {
    const int64_t ms = elapsed_ms(start);
    EXPECT_GE(ms, 690);
    EXPECT_LE(ms, 1700);
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(TcpStore, UnreachableServerTimesOutNamingTheAddress) {
  const uint16_t port = free_port();
  expect_connect_timeout("127.0.0.1", port,
                         {"127.0.0.1:" + std::to_string(port), "Connection refused"});
  // An address no packet reaches (TEST-NET-1): each connect attempt is
  // bounded by the deadline too.
  expect_connect_timeout("192.0.2.1", 29500, {"192.0.2.1:29500"});
}

TEST(TcpStore, Ipv6) {
  TcpStore server(server_options());
  // The server listens on every interface, IPv6 included.
  const int probe = ::socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 lo{};
  lo.sin6_family = AF_INET6;
  lo.sin6_addr = in6addr_loopback;
  const bool has_ipv6 =
      probe >= 0 && ::bind(probe, reinterpret_cast<sockaddr*>(&lo), sizeof lo) == 0;
  if (probe >= 0) ::close(probe);
  if (!has_ipv6) GTEST_SKIP() << "no IPv6 loopback here";
  TcpStoreOptions o = client_options(server);
  o.host = "::1";
  TcpStore v6(o);
  EXPECT_EQ(v6.address(), "[::1]:" + std::to_string(server.port()));
  v6.set("v6", bytes("yes"));
  EXPECT_EQ(server.get("v6"), bytes("yes"));
}

TEST(TcpStore, ClientRetriesUntilTheServerIsUp) {
  const uint16_t port = free_port();
  std::unique_ptr<TcpStore> server;
  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(400));
    TcpStoreOptions o = server_options();
    o.port = port;
    server = std::make_unique<TcpStore>(o);
    server->set("up", bytes("yes"));
  });
  TcpStoreOptions o;
  o.port = port;
  o.timeout = milliseconds(10000);
  const auto start = Clock::now();
  TcpStore client(o);
  EXPECT_GE(elapsed_ms(start), 350);
  EXPECT_EQ(client.get("up"), bytes("yes"));
  late.join();
}

TEST(TcpStore, ServerGoneFailsParkedCallsAtOnce) {
  auto server = std::make_unique<TcpStore>(server_options());
  TcpStore client(client_options(*server));
  const std::string address = client.address();
  std::thread stop([&] {
    std::this_thread::sleep_for(milliseconds(300));
    server.reset();
  });
  const auto start = Clock::now();
  try {
    client.get("k", milliseconds(10000));
    ADD_FAILURE() << "get returned from a server that stopped";
  } catch (const Timeout& e) {
    ADD_FAILURE() << "a Timeout where the connection closed: " << e.what();
  } catch (const CommunicationError& e) {
    EXPECT_NE(std::string(e.what()).find(address), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("closed the connection"), std::string::npos) << e.what();
  }
  EXPECT_LE(elapsed_ms(start), 2300);
  stop.join();
}

TEST(TcpStore, ServeOrConnectElectsOneServer) {
  const uint16_t port = free_port();
  std::vector<std::unique_ptr<TcpStore>> stores(6);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < stores.size(); ++i)
    threads.emplace_back([&, i] {
      TcpStoreOptions o;
      o.port = port;
      o.timeout = milliseconds(10000);
      stores[i] = TcpStore::serve_or_connect(o);
    });
  for (auto& t : threads) t.join();
  int servers = 0;
  for (auto& s : stores) servers += s->is_server() ? 1 : 0;
  EXPECT_EQ(servers, 1);
  for (size_t i = 0; i < stores.size(); ++i) stores[i]->add("n", static_cast<int64_t>(i + 1));
  EXPECT_EQ(stores[0]->get("n"), bytes("21"));
}

TEST(TcpStore, MessageLimits) {
  TcpStoreOptions so = server_options();
  so.max_message_bytes = 4096;
  TcpStore server(so);
  const std::vector<uint8_t> big(8192, 7);
  // The client's own limit: refused before sending.
  try {
    server.set("big", big);
    ADD_FAILURE() << "a value over the client's limit was sent";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("set('big')"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("over max_message_bytes (4096)"), std::string::npos)
        << e.what();
  }
  // A client with a larger limit than the server's: the server refuses the
  // message and closes that connection; the client reconnects on its next call.
  TcpStore client(client_options(server));
  try {
    client.set("big", big);
    ADD_FAILURE() << "the server took a message over its limit";
  } catch (const InvalidArgument& e) {
    ADD_FAILURE() << e.what();
  } catch (const CommunicationError& e) {
    EXPECT_NE(std::string(e.what()).find("refused the request: a message of 8203 bytes, over the "
                                         "limit of 4096"),
              std::string::npos)
        << e.what();
  }
  client.set("small", bytes("ok"));
  EXPECT_EQ(server.get("small"), bytes("ok"));
  EXPECT_FALSE(server.check({"big"}));
}

// ---- bad input sent to the server -------------------------------------------

// stderr into a file while alive; text() reads what was written.
class CaptureStderr {
 public:
  CaptureStderr() : path_("/tmp/relaxcc_store_test_" + std::to_string(::getpid()) + ".log") {
    std::fflush(stderr);
    saved_ = ::dup(2);
    FILE* f = std::fopen(path_.c_str(), "w");
    ::dup2(::fileno(f), 2);
    std::fclose(f);
  }
  ~CaptureStderr() {
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    std::remove(path_.c_str());
  }
  std::string text() const {
    std::ifstream in(path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  std::string path_;
  int saved_ = -1;
};

int raw_connect(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

// Everything the server sends until it closes the connection, or "TIMEOUT"
// when it keeps it open for 3 s.
std::string read_until_closed(int fd) {
  std::string out;
  const auto deadline = Clock::now() + milliseconds(3000);
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return "TIMEOUT";
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

TEST(TcpStore, CorruptInputClosesThatConnectionOnly) {
  TcpStoreOptions so = server_options();
  so.max_message_bytes = 4096;
  TcpStore server(so);
  // A client parked in a get across all the bad input.
  TcpStore parked(client_options(server));
  std::vector<uint8_t> parked_got;
  std::thread parked_thread([&] { parked_got = parked.get("after", milliseconds(20000)); });

  using store_wire::encode;
  using store_wire::encode_u64;
  auto with_u32 = [](std::string m, size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) m[at + static_cast<size_t>(i)] = static_cast<char>(v >> (8 * i));
    return m;
  };
  std::string garbage(1024, '\0');
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>(i * 131 + 17);
  std::string bad_version = encode(1, {"k", "v"});
  bad_version[4] = 9;
  std::string bad_check = encode(1, {"k", "v"});
  bad_check.back() ^= 0x20;
  struct Case {
    const char* name;
    std::string bytes;
    const char* logged;
  };
  const std::vector<Case> cases = {
      {"garbage", garbage, "bad magic"},
      {"version", bad_version, "protocol version 9"},
      {"oversized", with_u32(encode(1, {"k", "v"}), 8, 1u << 30), "over the limit of 4096"},
      {"checksum", bad_check, "checksum mismatch"},
      {"unknown op", encode(77, {"k"}), "unknown request code 77"},
      {"fields", encode(1, {"k"}), "set with 1 fields"},
      {"field length", with_u32(encode(1, {"k", "v"}), 16, 1000), "checksum mismatch"},
      {"timeout field", encode(2, {"k", "short"}), "timeout field is not 8 bytes"},
  };
  for (const auto& c : cases) {
    CaptureStderr capture;
    const int fd = raw_connect(server.port());
    ASSERT_EQ(::send(fd, c.bytes.data(), c.bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(c.bytes.size()));
    const std::string answer = read_until_closed(fd);
    ::close(fd);
    EXPECT_NE(answer, "TIMEOUT") << c.name << ": the server kept the connection open";
    // The answer is one protocol_error frame naming the reason.
    ASSERT_GE(answer.size(), store_wire::kHeaderBytes) << c.name;
    std::string error;
    const auto h = store_wire::parse_header(answer.data(), 1 << 20, error);
    ASSERT_TRUE(h.has_value()) << c.name << ": " << error;
    EXPECT_EQ(h->code, static_cast<uint16_t>(store_wire::Status::protocol_error)) << c.name;
    EXPECT_NE(answer.find(c.logged), std::string::npos) << c.name << ": " << answer;
    const std::string log = capture.text();
    EXPECT_NE(log.find("closing the connection from 127.0.0.1:"), std::string::npos)
        << c.name << ": " << log;
    EXPECT_NE(log.find(c.logged), std::string::npos) << c.name << ": " << log;
  }
  // Half a header, then a close: the server drops the connection quietly.
  {
    const int fd = raw_connect(server.port());
    ::send(fd, "RXS", 3, MSG_NOSIGNAL);
    ::close(fd);
  }
  // A body announced but never sent, then a close.
  {
    const int fd = raw_connect(server.port());
    const std::string m = encode(1, {"k", std::string(100, 'v')});
    ::send(fd, m.data(), 40, MSG_NOSIGNAL);
    ::close(fd);
  }
  // The server still serves: the parked get and a new client.
  TcpStore client(client_options(server));
  client.set("after", bytes("fine"));
  parked_thread.join();
  EXPECT_EQ(parked_got, bytes("fine"));
  EXPECT_EQ(client.num_keys(), 1);
}

// ---- rendezvous in child processes ----------------------------------------

std::vector<uint8_t> blob_for(pid_t pid) {
  // Binary, with a length that depends on the pid.
  std::string b = "pid=" + std::to_string(pid);
  b.push_back('\0');
  b.append(static_cast<size_t>(pid % 5), '\xff');
  return bytes(b);
}

std::string hex(const std::vector<uint8_t>& v) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (uint8_t c : v) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

// Runs in a child: rendezvous as the environment says, report on stdout.
// Exits with 0 after a rendezvous, kChildFailed after a relaxcc error.
constexpr int kChildFailed = 3;
int rendezvous_child() {
  if (const char* d = std::getenv("STORE_TEST_DELAY_MS"))
    std::this_thread::sleep_for(milliseconds(std::atoi(d)));
  const auto start = Clock::now();
  try {
    const RendezvousOptions options = RendezvousOptions::from_env();
    auto store = open_rendezvous_store(options);
    const bool serves = store->is_server();
    const auto blob = blob_for(::getpid());
    const RendezvousResult r = rendezvous(options, *store, blob);
    std::printf("ok %d %d %d %lld\n", r.rank, r.size, serves ? 1 : 0,
                static_cast<long long>(elapsed_ms(start)));
    for (const auto& b : r.blobs) std::printf("%s\n", hex(b).c_str());
    std::fflush(stdout);
    if (const char* hold = std::getenv("STORE_TEST_HOLD_MS"))
      std::this_thread::sleep_for(milliseconds(std::atoi(hold)));
  } catch (const Error& e) {
    const char* kind = dynamic_cast<const Timeout*>(&e)              ? "Timeout"
                       : dynamic_cast<const PeerMismatch*>(&e)       ? "PeerMismatch"
                       : dynamic_cast<const CommunicationError*>(&e) ? "CommunicationError"
                       : dynamic_cast<const InvalidArgument*>(&e)    ? "InvalidArgument"
                                                                     : "Error";
    std::printf("error %s %lld\n%s\n", kind, static_cast<long long>(elapsed_ms(start)), e.what());
    std::fflush(stdout);
    return kChildFailed;
  }
  std::fflush(stdout);
  return 0;
}

struct Child : test::ChildRun {
  // Parsed report.
  bool ok = false;
  int rank = -1, size = -1;
  bool serves = false;
  std::string kind;
  int64_t elapsed = -1;
  std::string message;
  std::vector<std::string> blobs;  // hex
};

const std::vector<std::string> kControlled = {"RANK",
                                              "WORLD_SIZE",
                                              "OMPI_COMM_WORLD_RANK",
                                              "OMPI_COMM_WORLD_SIZE",
                                              "PMIX_RANK",
                                              "PMI_RANK",
                                              "SLURM_PROCID",
                                              "SLURM_NTASKS",
                                              "MASTER_ADDR",
                                              "MASTER_PORT",
                                              "RELAXCC_RENDEZVOUS",
                                              "RELAXCC_TIMEOUT_MS",
                                              "STORE_TEST_DELAY_MS",
                                              "STORE_TEST_HOLD_MS"};

Child spawn(const std::map<std::string, std::string>& vars) {
  Child c;
  static_cast<test::ChildRun&>(c) = test::spawn_child("--rendezvous-child", vars, kControlled);
  return c;
}

// Reads every child's report (killing any still running after 20 s).
void collect(std::vector<Child>& children) {
  std::vector<test::ChildRun*> runs;
  for (auto& c : children) runs.push_back(&c);
  test::collect_children(runs, milliseconds(20000));
  for (auto& c : children) {
    const std::string& text = c.text;
    EXPECT_TRUE(WIFEXITED(c.status) &&
                WEXITSTATUS(c.status) == (text.rfind("ok", 0) == 0 ? 0 : kChildFailed))
        << "child " << c.pid << " status " << c.status << ": " << text;
    std::istringstream in(text);
    std::string head;
    in >> head;
    if (head == "ok") {
      int serves = 0;
      in >> c.rank >> c.size >> serves >> c.elapsed;
      c.ok = true;
      c.serves = serves != 0;
      std::string line;
      std::getline(in, line);
      while (std::getline(in, line)) c.blobs.push_back(line);
    } else if (head == "error") {
      in >> c.kind >> c.elapsed;
      std::string line;
      std::getline(in, line);
      std::getline(in, c.message);
    } else {
      ADD_FAILURE() << "child " << c.pid << " reported: " << text;
    }
  }
}

// Every child succeeded with size n, the ranks 0..n-1 once each, and every
// child holds blobs[r] == the blob of the child of rank r.
void expect_exchange(const std::vector<Child>& children, int n) {
  std::map<int, pid_t> pid_of_rank;
  for (const auto& c : children) {
    ASSERT_TRUE(c.ok) << "child " << c.pid << ": " << c.kind << ": " << c.message;
    EXPECT_EQ(c.size, n);
    EXPECT_TRUE(pid_of_rank.emplace(c.rank, c.pid).second) << "rank " << c.rank << " twice";
  }
  ASSERT_EQ(pid_of_rank.size(), static_cast<size_t>(n));
  EXPECT_EQ(pid_of_rank.begin()->first, 0);
  EXPECT_EQ(pid_of_rank.rbegin()->first, n - 1);
  for (const auto& c : children) {
    ASSERT_EQ(c.blobs.size(), static_cast<size_t>(n)) << "child " << c.pid;
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(c.blobs[static_cast<size_t>(r)], hex(blob_for(pid_of_rank[r])))
          << "child " << c.pid << ", blob of rank " << r;
  }
}

std::string loopback(uint16_t port) {
  return "127.0.0.1:" + std::to_string(port);
}

// Runs one child per {RANK, WORLD_SIZE} of `ranks` (a rank of -1: no RANK,
// by arrival) with RELAXCC_RENDEZVOUS on `port`, RELAXCC_TIMEOUT_MS
// `timeout_ms` and the variables of `more`, and collects their reports.
std::vector<Child> run_ranks(uint16_t port, const std::vector<std::pair<int, int>>& ranks,
                             int timeout_ms, const std::map<std::string, std::string>& more = {}) {
  std::vector<Child> children;
  for (const auto& [rank, size] : ranks) {
    auto vars = more;
    if (rank >= 0) vars["RANK"] = std::to_string(rank);
    vars["WORLD_SIZE"] = std::to_string(size);
    vars["RELAXCC_RENDEZVOUS"] = loopback(port);
    vars["RELAXCC_TIMEOUT_MS"] = std::to_string(timeout_ms);
    children.push_back(spawn(vars));
  }
  collect(children);
  return children;
}

TEST(Rendezvous, RankAndSizeFromRankWorldSize) {
  for (int n : {1, 2, 5, 8}) {
    std::vector<std::pair<int, int>> ranks;
    for (int r = 0; r < n; ++r) ranks.emplace_back(r, n);
    const std::vector<Child> children = run_ranks(free_port(), ranks, 10000);
    expect_exchange(children, n);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(children[static_cast<size_t>(r)].rank, r) << "n=" << n;
      EXPECT_EQ(children[static_cast<size_t>(r)].serves, r == 0) << "n=" << n;
    }
  }
}

TEST(Rendezvous, OpenMpiVariablesAndTorchrunAddressWithLateRankZero) {
  const uint16_t port = free_port();
  std::vector<Child> children;
  for (int r = 0; r < 3; ++r)
    children.push_back(spawn({{"OMPI_COMM_WORLD_RANK", std::to_string(r)},
                              {"OMPI_COMM_WORLD_SIZE", "3"},
                              {"MASTER_ADDR", "127.0.0.1"},
                              {"MASTER_PORT", std::to_string(port)},
                              {"RELAXCC_TIMEOUT_MS", "10000"},
                              // Rank 0 serves the store and comes last: the others retry.
                              {"STORE_TEST_DELAY_MS", r == 0 ? "500" : "0"}}));
  collect(children);
  expect_exchange(children, 3);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(children[static_cast<size_t>(r)].rank, r);
}

TEST(Rendezvous, RanksByArrival) {
  for (int n : {1, 4, 8}) {
    const std::vector<Child> children = run_ranks(
        free_port(), std::vector<std::pair<int, int>>(static_cast<size_t>(n), {-1, n}), 10000);
    expect_exchange(children, n);
    // Exactly one process serves the store: the first to bind its port.
    EXPECT_EQ(
        std::count_if(children.begin(), children.end(), [](const Child& c) { return c.serves; }), 1)
        << "n=" << n;
  }
}

// A failure every child reports: `kind`, a message containing each of
// `parts`, within `bound_ms` of its start.
void expect_failure(const std::vector<Child>& children, const std::string& kind,
                    const std::vector<std::string>& parts, int64_t bound_ms) {
  for (const auto& c : children) {
    ASSERT_FALSE(c.ok) << "child " << c.pid << " succeeded as rank " << c.rank;
    EXPECT_EQ(c.kind, kind) << c.message;
    for (const auto& p : parts) EXPECT_NE(c.message.find(p), std::string::npos) << c.message;
    EXPECT_LE(c.elapsed, bound_ms) << c.message;
  }
}

TEST(Rendezvous, UnreachableStore) {
  // Rank 1 of 2, and no rank 0 to serve the store: Timeout at 1.5 s (+1.5 s).
  const uint16_t port = free_port();
  const std::vector<Child> children = run_ranks(port, {{1, 2}}, 1500);
  expect_failure(children, "Timeout", {loopback(port), "served by rank 0", "unreachable"}, 3000);
  EXPECT_GE(children[0].elapsed, 1490);
}

TEST(Rendezvous, RankUsedTwice) {
  const uint16_t port = free_port();
  const std::vector<Child> children = run_ranks(port, {{0, 3}, {1, 3}, {1, 3}}, 8000);
  // Every process fails, well before the timeout, naming the rank and both
  // processes that claim it.
  expect_failure(children, "PeerMismatch",
                 {"rank 1 is used twice", "pid " + std::to_string(children[1].pid),
                  "pid " + std::to_string(children[2].pid), loopback(port)},
                 7000);
}

TEST(Rendezvous, SizesDisagree) {
  const uint16_t port = free_port();
  const std::vector<Child> children = run_ranks(port, {{0, 2}, {1, 3}}, 8000);
  expect_failure(
      children, "PeerMismatch",
      {"disagree on the size", "with size 2", "with size 3", "rank 0", "rank 1", loopback(port)},
      7000);
}

TEST(Rendezvous, PeerNeverArrives) {
  const uint16_t port = free_port();
  const std::vector<Child> children = run_ranks(port, {{0, 3}, {1, 3}}, 1500);
  // Both fail by the first one's timeout (1.5 s, +1.5 s allowed).
  expect_failure(children, "Timeout", {"rank 2 of 3 never arrived within 1500 ms", loopback(port)},
                 3000);
  EXPECT_GE(std::max(children[0].elapsed, children[1].elapsed), 1490);
}

TEST(Rendezvous, PeerNeverArrivesByArrival) {
  const uint16_t port = free_port();
  const std::vector<Child> children = run_ranks(port, {{-1, 3}, {-1, 3}}, 1500);
  expect_failure(children, "Timeout", {"rank 2 of 3 never arrived within 1500 ms", loopback(port)},
                 3000);
}

TEST(Rendezvous, MoreProcessesThanTheSizeByArrival) {
  // The processes keep their store 2 s after the rendezvous, as a job's
  // processes do while they run. (A process that comes after the store's
  // server ended serves a store of its own, by arrival, and times out
  // waiting for the others.)
  const std::vector<Child> children =
      run_ranks(free_port(), {{-1, 2}, {-1, 2}, {-1, 2}}, 8000, {{"STORE_TEST_HOLD_MS", "2000"}});
  // The first two arrivals form the world; the third fails alone.
  std::vector<Child> ok, extra;
  for (auto& c : children) (c.ok ? ok : extra).push_back(c);
  ASSERT_EQ(ok.size(), 2u);
  expect_exchange(ok, 2);
  expect_failure(extra, "PeerMismatch",
                 {"more processes than the size", "arrived as process 3 for size 2"}, 7000);
}

TEST(Rendezvous, OptionsFromEnvironment) {
  ::setenv("MASTER_ADDR", "node7", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  ::setenv("SLURM_PROCID", "3", 1);
  ::setenv("SLURM_NTASKS", "16", 1);
  RendezvousOptions o = RendezvousOptions::from_env();
  EXPECT_EQ(o.host, "node7");
  EXPECT_EQ(o.port, 29500);
  EXPECT_EQ(o.rank, 3);
  EXPECT_EQ(o.size, 16);
  // RELAXCC_RENDEZVOUS wins over MASTER_*; RANK/WORLD_SIZE over the launchers'.
  ::setenv("RELAXCC_RENDEZVOUS", "[::1]:1234", 1);
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  o = RendezvousOptions::from_env();
  EXPECT_EQ(o.host, "::1");
  EXPECT_EQ(o.port, 1234);
  EXPECT_EQ(o.rank, 0);
  EXPECT_EQ(o.size, 2);
  EXPECT_EQ(o.address(), "[::1]:1234");
  ::setenv("RANK", "x1", 1);
  try {
    RendezvousOptions::from_env();
    ADD_FAILURE() << "RANK=x1 parsed";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("RANK='x1'"), std::string::npos) << e.what();
  }
  ::setenv("RANK", "2", 1);  // out of range for WORLD_SIZE=2
  EXPECT_THROW(RendezvousOptions::from_env().validate(), InvalidArgument);
  for (const char* v : {"MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS",
                        "RELAXCC_RENDEZVOUS", "RANK", "WORLD_SIZE"})
    ::unsetenv(v);
  try {
    RendezvousOptions::from_env().validate();
    ADD_FAILURE() << "no address accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("RELAXCC_RENDEZVOUS"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace relaxcc

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--rendezvous-child") == 0)
    return relaxcc::rendezvous_child();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
