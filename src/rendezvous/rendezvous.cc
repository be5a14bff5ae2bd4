#include "relaxcc/rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <random>

#include "relaxcc/errors.h"
#include "relaxcc/tunables.h"
#include "src/rendezvous/socket.h"

namespace relaxcc {

using store_detail::Clock;

namespace {

constexpr std::chrono::milliseconds kLinger{500};

std::vector<uint8_t> bytes(std::string_view s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}
std::string text(const std::vector<uint8_t>& v) {
  return std::string(v.begin(), v.end());
}

// The value of environment variable `name`, or nullptr when unset or empty.
const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

int64_t parse_int(std::string_view s, int64_t lo, int64_t hi, const std::string& what) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  RELAXCC_ENFORCE(ec == std::errc() && end == s.data() + s.size() && v >= lo && v <= hi,
                  InvalidArgument, what, "='", s, "' is not an integer in [", lo, ", ", hi, "]");
  return v;
}

// One process's identity: its host, pid and a random nonce (pids repeat
// across hosts and containers).
struct Identity {
  std::string host;
  int64_t pid = 0;
  uint64_t nonce = 0;

  static Identity mine() {
    Identity id;
    char name[256] = {};
    if (::gethostname(name, sizeof name - 1) != 0) std::snprintf(name, sizeof name, "unknown");
    id.host = name;
    id.pid = ::getpid();
    std::random_device rd;
    id.nonce = (uint64_t{rd()} << 32) ^ rd();
    return id;
  }
  std::string encode() const { return detail::concat(host, "\n", pid, "\n", nonce, "\n"); }
  // Decodes the identity at the start of `v`; returns the rest.
  static std::string_view decode(std::string_view v, Identity& out) {
    std::string_view parts[3];
    for (auto& p : parts) {
      const size_t nl = v.find('\n');
      if (nl == std::string_view::npos) {
        out.host = "(corrupt entry)";
        return {};
      }
      p = v.substr(0, nl);
      v.remove_prefix(nl + 1);
    }
    out.host = std::string(parts[0]);
    std::from_chars(parts[1].data(), parts[1].data() + parts[1].size(), out.pid);
    std::from_chars(parts[2].data(), parts[2].data() + parts[2].size(), out.nonce);
    return v;
  }
  std::string describe() const { return detail::concat(host, " pid ", pid); }
  bool operator==(const Identity& o) const {
    return host == o.host && pid == o.pid && nonce == o.nonce;
  }
};

std::string list_ranks(const std::vector<int>& ranks) {
  std::string out;
  const size_t shown = std::min<size_t>(ranks.size(), 16);
  for (size_t i = 0; i < shown; ++i) out += detail::concat(i ? ", " : "", ranks[i]);
  if (ranks.size() > shown) out += detail::concat(" and ", ranks.size() - shown, " more");
  return out;
}

// A failure every process of the rendezvous learns: its kind and message
// live under the status key.
struct Failure {
  std::string kind;  // "PeerMismatch" or "Timeout"
  std::string message;
};

[[noreturn]] void throw_failure(const Failure& f) {
  if (f.kind == "Timeout") RELAXCC_THROW(Timeout, f.message);
  RELAXCC_THROW(PeerMismatch, f.message);
}

class Session {
 public:
  Session(const RendezvousOptions& o, Store& store)
      : o_(o),
        store_(store),
        deadline_(store_detail::deadline_after(o.timeout)),
        prefix_(detail::concat("relaxcc/rendezvous/", o.job, "/", o.generation, "/")),
        me_(Identity::mine()),
        rank_(o.rank) {}

  int rank() const { return rank_; }

  RendezvousResult run(std::span<const uint8_t> blob) {
    const int size = o_.size;
    store_.add(key("joined"), 1);
    if (rank_ < 0) {
      const int64_t arrival = store_.add(key("next_rank"), 1);
      if (arrival > size) extra_process(arrival);
      rank_ = static_cast<int>(arrival - 1);
    }
    agree_on_size();
    claim_rank(blob);
    if (store_.add(key("arrived"), 1) == size) store_.compare_set(key("status"), {}, bytes("ok"));
    wait_for_status();

    RendezvousResult result;
    result.rank = rank_;
    result.size = size;
    result.blobs.resize(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) {
      const std::string entry = text(store_.get(rank_key(r)));
      Identity who;
      const std::string_view rest = Identity::decode(entry, who);
      result.blobs[static_cast<size_t>(r)].assign(rest.begin(), rest.end());
      RELAXCC_ENFORCE(r != rank_ || who == me_, InternalError, "the entry of rank ", r,
                      " is not this process's: ", who.describe());
    }
    leave();
    return result;
  }

 private:
  std::string key(std::string_view name) const { return detail::concat(prefix_, name); }
  std::string rank_key(int r) const { return detail::concat(prefix_, "rank/", r); }
  std::chrono::milliseconds remaining() const {
    return std::max(std::chrono::milliseconds(0),
                    std::chrono::ceil<std::chrono::milliseconds>(deadline_ - Clock::now()));
  }
  // How long the process serving the store waits for the others to leave:
  // what remains of the timeout, and at least kLinger, as processes whose
  // timeouts expire with this one's are still reading the outcome.
  std::chrono::milliseconds lingering() const { return std::max(remaining(), kLinger); }

  // Publishes `f` so that every process waiting in this rendezvous fails
  // with it, and throws it here. A process that comes after the others
  // completed without it fails alone, at once.
  [[noreturn]] void fail(const Failure& f) {
    const std::string after =
        text(store_.compare_set(key("status"), {}, bytes(detail::concat(f.kind, "\n", f.message))));
    if (after == "ok") throw_failure(f);
    linger_and_throw(f);
  }

  // Throws `f`; the process serving the store first waits until every
  // process that joined this rendezvous has learned of the failure (or the
  // deadline), so as not to take the store away from them. Each process's
  // last request is answered before the server's wait is.
  [[noreturn]] void linger_and_throw(const Failure& f) {
    try {
      if (store_.add(key("acked"), 1) >= store_.add(key("joined"), 0))
        store_.set(key("all_acked"), bytes("1"));
      if (store_.is_server()) store_.wait({key("all_acked")}, lingering());
    } catch (const Error&) {
      // The failure is what this process reports; the store may be gone.
    }
    throw_failure(f);
  }

  // A process that arrived after `size` others, with ranks by arrival:
  // those ranks belong to the first arrivals, who go on without it. It
  // fails once they are done (it may be the one serving their store).
  [[noreturn]] void extra_process(int64_t arrival) {
    const Failure f{"PeerMismatch",
                    detail::concat("more processes than the size: ", me_.describe(),
                                   " arrived as process ", arrival, " for size ", o_.size)};
    std::string status;
    try {
      status = text(store_.get(key("status"), remaining()));
      if (status == "ok" && store_.is_server()) store_.wait({key("done")}, lingering());
    } catch (const Error&) {
      // The failure is what this process reports.
    }
    if (status == "ok") throw_failure(f);
    linger_and_throw(f);
  }

  void agree_on_size() {
    const std::string mine = detail::concat(o_.size, "\n", rank_, "\n", me_.encode());
    const std::string got = text(store_.compare_set(key("size"), {}, bytes(mine)));
    if (got == mine) return;
    const size_t nl = got.find('\n');
    const int64_t their_size =
        parse_int(std::string_view(got).substr(0, nl), 0, INT64_MAX, "the size stored");
    if (their_size == o_.size) return;
    int64_t their_rank = -1;
    const std::string_view after = std::string_view(got).substr(nl + 1);
    const size_t nl2 = after.find('\n');
    std::from_chars(after.data(), after.data() + nl2, their_rank);
    Identity who;
    Identity::decode(after.substr(nl2 + 1), who);
    fail({"PeerMismatch",
          detail::concat("the processes disagree on the size: rank ", rank_, " (", me_.describe(),
                         ") was started with size ", o_.size, ", rank ", their_rank, " (",
                         who.describe(), ") with size ", their_size)});
  }

  void claim_rank(std::span<const uint8_t> blob) {
    std::string mine = me_.encode();
    mine.append(reinterpret_cast<const char*>(blob.data()), blob.size());
    const std::string got = text(store_.compare_set(rank_key(rank_), {}, bytes(mine)));
    if (got == mine) return;
    Identity first;
    Identity::decode(got, first);
    fail({"PeerMismatch", detail::concat("rank ", rank_, " is used twice: by ", first.describe(),
                                         " and by ", me_.describe())});
  }

  // Waits until the status is set (every process arrived, or one failed)
  // and throws the failure it records. One round trip learns the outcome,
  // so that a failing server process cannot leave between two.
  void wait_for_status() {
    const std::string status = key("status");
    std::string value;
    try {
      value = text(store_.get(status, remaining()));
    } catch (const Timeout&) {
      // The store answered late or the status is missing: check tells which
      // (and throws if the store itself is gone).
      if (!store_.check({status})) {
        std::vector<int> missing;
        for (int r = 0; r < o_.size; ++r)
          if (!store_.check({rank_key(r)})) missing.push_back(r);
        const Failure f{
            "Timeout",
            detail::concat(missing.size() == 1 ? "rank " : "ranks ", list_ranks(missing), " of ",
                           o_.size, " never arrived within ", o_.timeout.count(), " ms")};
        const std::string after =
            text(store_.compare_set(status, {}, bytes(detail::concat(f.kind, "\n", f.message))));
        if (after != "ok") linger_and_throw(read_failure(after));
      }
      value = text(store_.get(status));
    }
    if (value != "ok") linger_and_throw(read_failure(value));
  }

  static Failure read_failure(const std::string& value) {
    const size_t nl = value.find('\n');
    if (nl == std::string::npos) return {"PeerMismatch", "a corrupt rendezvous status: " + value};
    return {value.substr(0, nl), value.substr(nl + 1)};
  }

  // On the process serving the store, returns once every process read every
  // blob (so that the store may go); each other process's last request is
  // answered before that.
  void leave() {
    store_.set(key(detail::concat("read/", rank_)), bytes("1"));
    if (store_.add(key("read"), 1) == o_.size) store_.set(key("done"), bytes("1"));
    if (!store_.is_server()) return;
    try {
      store_.wait({key("done")}, lingering());
    } catch (const Timeout&) {
      if (store_.check({key("done")})) return;
      std::vector<int> missing;
      for (int r = 0; r < o_.size; ++r)
        if (!store_.check({key(detail::concat("read/", r))})) missing.push_back(r);
      RELAXCC_THROW(Timeout, missing.size() == 1 ? "rank " : "ranks ", list_ranks(missing), " of ",
                    o_.size, " arrived but did not read the others' entries within ",
                    o_.timeout.count(), " ms (they stopped during the rendezvous)");
    }
  }

  const RendezvousOptions& o_;
  Store& store_;
  const Clock::time_point deadline_;
  const std::string prefix_;
  const Identity me_;
  int rank_;
};

}  // namespace

RendezvousOptions RendezvousOptions::from_env() {
  RendezvousOptions o;
  const Tunables t = Tunables::from_env();
  o.timeout = std::chrono::milliseconds(t.timeout_ms);
  if (!t.rendezvous.empty()) {
    const std::string& a = t.rendezvous;
    const size_t colon = a.rfind(':');
    RELAXCC_ENFORCE(colon != std::string::npos && colon > 0, InvalidArgument,
                    "RELAXCC_RENDEZVOUS='", a, "' is not host:port");
    std::string host = a.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
      host = host.substr(1, host.size() - 2);
    o.host = host;
    o.port = static_cast<uint16_t>(parse_int(std::string_view(a).substr(colon + 1), 1, 65535,
                                             "the port of RELAXCC_RENDEZVOUS"));
  } else if (const char* addr = env("MASTER_ADDR")) {
    const char* port = env("MASTER_PORT");
    RELAXCC_ENFORCE(port != nullptr, InvalidArgument, "MASTER_ADDR=", addr,
                    " is set but MASTER_PORT is not");
    o.host = addr;
    o.port = static_cast<uint16_t>(parse_int(port, 1, 65535, "MASTER_PORT"));
  }
  const LaunchEnvironment launch = LaunchEnvironment::from_env();
  if (launch.rank >= 0) o.rank = launch.rank;
  if (launch.size >= 1) o.size = launch.size;
  return o;
}

std::string RendezvousOptions::address() const {
  return store_detail::join_host_port(host, port);
}

void RendezvousOptions::validate() const {
  RELAXCC_ENFORCE(!host.empty() && port != 0, InvalidArgument,
                  "rendezvous: no store address: set RELAXCC_RENDEZVOUS=host:port, or "
                  "MASTER_ADDR and MASTER_PORT");
  RELAXCC_ENFORCE(size >= 1, InvalidArgument, "rendezvous at ", address(),
                  ": no size: set WORLD_SIZE (or the launcher's "
                  "OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS)");
  RELAXCC_ENFORCE(rank >= -1 && rank < size, InvalidArgument, "rendezvous at ", address(),
                  ": rank ", rank, " is out of range for size ", size);
  RELAXCC_ENFORCE(timeout.count() > 0, InvalidArgument, "rendezvous at ", address(),
                  ": the timeout must be positive");
}

std::unique_ptr<Store> open_rendezvous_store(const RendezvousOptions& options) {
  options.validate();
  TcpStoreOptions t;
  t.host = options.host;
  t.port = options.port;
  t.timeout = options.timeout;
  const std::string who =
      options.rank < 0 ? std::string("the first process to bind it")
                       : detail::concat("rank 0", options.rank == 0 ? " (this process)" : "");
  try {
    if (options.rank < 0) return TcpStore::serve_or_connect(t);
    t.is_server = options.rank == 0;
    return std::make_unique<TcpStore>(t);
  } catch (const Timeout& e) {
    RELAXCC_THROW(Timeout, "rendezvous: the store at ", options.address(), ", served by ", who,
                  ", is unreachable: ", e.message());
  } catch (const CommunicationError& e) {
    RELAXCC_THROW(CommunicationError, "rendezvous: the store at ", options.address(),
                  ", served by ", who, ": ", e.message());
  }
}

RendezvousResult rendezvous(const RendezvousOptions& options, Store& store,
                            std::span<const uint8_t> blob) {
  options.validate();
  Session session(options, store);
  auto context = [&] {
    return detail::concat("rendezvous of job '", options.job, "' generation ", options.generation,
                          " at ", store.address(), session.rank() >= 0 ? " as rank " : "",
                          session.rank() >= 0 ? std::to_string(session.rank()) : std::string(),
                          ": ");
  };
  try {
    return session.run(blob);
  } catch (const Timeout& e) {
    RELAXCC_THROW(Timeout, context(), e.message());
  } catch (const PeerMismatch& e) {
    RELAXCC_THROW(PeerMismatch, context(), e.message());
  } catch (const CommunicationError& e) {
    RELAXCC_THROW(CommunicationError, context(), e.message());
  } catch (const InvalidArgument& e) {
    RELAXCC_THROW(InvalidArgument, context(), e.message());
  }
}

}  // namespace relaxcc
