// The UCX wing's Transport and Endpoints (src/ucx) between processes this
// program forks itself (no mpirun): each child is a rank, publishes its
// worker's address blob in a temporary folder and reads the others' from
// there. A child reports its GoogleTest failures through its exit code.
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "child_processes.h"
#include "relaxcc/errors.h"
#include "src/engine/transport.h"
#include "src/ucx/ucx_transport.h"
#include "src/ucx/worker.h"

namespace relaxcc::ucx {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// The engine's view of one rank's transport and endpoint set, with the
// requests it posted kept in a slot array as the engine keeps them.
struct Completion {
  int64_t slot = 0;
  int peer = -1;  // sends: the destination; receives: the source
  size_t bytes = 0;
  bool send = false;
  bool cancelled = false;
  std::string error;  // Transport::error_string() of a failed request
};

struct ProbedMessage {
  engine::Message message{};
  size_t bytes = 0;
};

struct LostPeer {
  int rank;
  std::string reason;
};

class Channel {
 public:
  explicit Channel(UcxConnection c) : c_(std::move(c)) {}
  ~Channel() {
    // The engine's order: the endpoint set goes first, the transport with it.
    c_.endpoints.reset();
  }

  int isend(int64_t slot, const void* buf, size_t bytes, int peer, int tag,
            engine::Space space = engine::Space::collective) {
    return add(slot, true, peer, c_.endpoints->isend(space, buf, bytes, peer, tag));
  }
  int irecv(int64_t slot, void* buf, size_t bytes, int peer, int tag,
            engine::Space space = engine::Space::collective) {
    return add(slot, false, peer, c_.endpoints->irecv(space, buf, bytes, peer, tag));
  }
  bool improbe(int peer, int tag, engine::Space space, ProbedMessage* m) {
    return c_.endpoints->improbe(space, peer, tag, &m->message, &m->bytes);
  }
  int imrecv(int64_t slot, void* buf, size_t bytes, ProbedMessage& m) {
    return add(slot, false, -1, c_.endpoints->imrecv(buf, bytes, &m.message));
  }
  void cancel(int id) { c_.transport->cancel(requests_[static_cast<size_t>(id)]); }
  size_t testsome(std::vector<Completion>& out) {
    const int n = static_cast<int>(requests_.size());
    indices_.resize(requests_.size());
    completions_.resize(requests_.size());
    int failure = 0;
    const int k =
        c_.transport->test_some(n, requests_.data(), indices_.data(), completions_.data(), failure);
    EXPECT_EQ(failure, 0);
    for (int i = 0; i < k; ++i) {
      const auto index = static_cast<size_t>(indices_[static_cast<size_t>(i)]);
      const engine::Completion& e = completions_[static_cast<size_t>(i)];
      Completion done;
      done.slot = slots_[index];
      done.send = sends_[index];
      done.peer = done.send || e.error != 0 ? peers_[index] : e.source;
      if (!done.send && e.error != 0 && e.source >= 0) done.peer = e.source;
      done.bytes = done.send ? 0 : e.bytes;
      done.cancelled = e.cancelled;
      if (e.error != 0) done.error = c_.transport->error_string(e.error);
      out.push_back(done);
      free_.push_back(index);
    }
    return static_cast<size_t>(k);
  }
  void progress() {
    int failure = 0;
    c_.transport->test_some(0, nullptr, nullptr, nullptr, failure);
  }
  bool wait(std::chrono::milliseconds timeout) { return c_.transport->wait(timeout); }
  size_t pending() const { return c_.transport->pending(); }
  void fail_peer(int peer, const std::string& reason) { c_.endpoints->fail_peer(peer, reason); }
  std::vector<LostPeer> take_lost_peers() {
    std::vector<LostPeer> out;
    for (auto& e : c_.transport->take_peer_errors()) {
      EXPECT_EQ(e.endpoints, c_.endpoints.get());
      out.push_back(LostPeer{e.rank, e.reason});
    }
    return out;
  }
  PeerState peer_state(int peer) const { return c_.endpoints->peer_state(peer); }
  bool same_host(int peer) const { return c_.endpoints->same_host(peer); }
  std::string endpoint_info(int peer) const { return c_.endpoints->endpoint_info(peer); }
  UcxTransport& transport() { return *c_.transport; }
  UcxEndpoints& endpoints() { return *c_.endpoints; }

 private:
  int add(int64_t slot, bool send, int peer, engine::Request r) {
    size_t i;
    if (!free_.empty()) {
      i = free_.back();
      free_.pop_back();
    } else {
      i = requests_.size();
      requests_.emplace_back();
      slots_.emplace_back();
      sends_.emplace_back();
      peers_.emplace_back();
    }
    requests_[i] = r;
    slots_[i] = slot;
    sends_[i] = send;
    peers_[i] = peer;
    return static_cast<int>(i);
  }

  UcxConnection c_;
  std::vector<engine::Request> requests_;
  std::vector<int64_t> slots_;
  std::vector<bool> sends_;
  std::vector<int> peers_;
  std::vector<size_t> free_;
  std::vector<int> indices_;
  std::vector<engine::Completion> completions_;
};

// Shared by the parent and its children (an anonymous shared mapping made
// before fork).
struct Shared {
  std::atomic<int> arrived{0};        // barrier arrivals, all rounds together
  std::atomic<int> ready{0};          // children ready for the parent's signal
  std::atomic<int64_t> signal_ns{0};  // CLOCK_MONOTONIC when the parent signalled
};

class Ranks {
 public:
  Ranks() {
    void* p =
        mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    shared_ = new (p) Shared();
  }
  ~Ranks() {
    test::kill_children(pids_);
    munmap(shared_, sizeof(Shared));
  }

  Shared& shared() { return *shared_; }
  pid_t pid(int rank) const { return pids_[static_cast<size_t>(rank)]; }

  // Forks `n` ranks that each run body(channel, rank, shared).
  void spawn(int n, std::function<void(Channel&, int)> body, EndpointOptions options = {}) {
    n_ = n;
    for (int r = 0; r < n; ++r) {
      const pid_t pid = fork();
      if (pid == 0) _exit(run_child(r, body, options));
      pids_.push_back(pid);
    }
  }

  // Waits until every child exited (at most `timeout`); EXPECTs exit code 0
  // from each, except from the ranks in `killed`.
  void join(std::chrono::milliseconds timeout = 25s, std::vector<int> killed = {}) {
    test::join_children(pids_, timeout, killed);
  }

  // Waits (in the parent) until `count` children called ready().
  void await_ready(int count) {
    const auto deadline = Clock::now() + 15s;
    while (shared_->ready.load() < count && Clock::now() < deadline)
      std::this_thread::sleep_for(1ms);
    ASSERT_GE(shared_->ready.load(), count) << "the ranks never got ready";
  }

  // Sends `sig` to rank `rank`, noting the time for the children.
  void signal(int rank, int sig) {
    shared_->signal_ns.store(monotonic_ns());
    ::kill(pid(rank), sig);
  }

 private:
  int run_child(int rank, const std::function<void(Channel&, int)>& body,
                const EndpointOptions& options) {
    try {
      auto worker = std::make_shared<Worker>(std::make_shared<Context>());
      blobs_.publish(rank, worker->blob());
      std::vector<Blob> blobs;
      for (int r = 0; r < n_; ++r) blobs.push_back(blobs_.read(r, 15s));
      {
        Channel channel(connect(worker, blobs, rank, options));
        body(channel, rank);
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[rank %d] exception: %s\n", rank, e.what());
      std::fflush(stdout);
      return 2;
    }
    std::fflush(stdout);
    return testing::Test::HasFailure() ? 1 : 0;
  }

  Shared* shared_ = nullptr;
  test::BlobDirectory blobs_{"relaxcc_ucx_test"};
  std::vector<pid_t> pids_;
  int n_ = 0;
};

// Every one of `n` ranks arrives (round `round`, counted from 1 by each
// caller) before any leaves; progresses while it waits.
void barrier(Channel& ch, Shared& s, int n, int round) {
  s.arrived.fetch_add(1);
  const auto deadline = Clock::now() + 15s;
  while (s.arrived.load() < n * round) {
    ch.progress();
    if (Clock::now() > deadline) throw std::runtime_error("barrier timed out");
    std::this_thread::sleep_for(100us);
  }
}

// Tests until `count` completions arrived or `timeout` passed.
std::vector<Completion> collect(Channel& ch, size_t count,
                                std::chrono::milliseconds timeout = 15s) {
  std::vector<Completion> out;
  const auto deadline = Clock::now() + timeout;
  while (out.size() < count && Clock::now() < deadline) {
    if (ch.testsome(out) == 0) ch.wait(10ms);
  }
  return out;
}

const std::string& message_of(const std::string& error) {
  return error;
}

uint64_t word(int src, int dst, int size_index, uint64_t i) {
  return (uint64_t(src) << 56) | (uint64_t(dst) << 48) | (uint64_t(size_index) << 40) | i;
}

constexpr size_t kSizes[] = {8, 4096, size_t{1} << 20, size_t{16} << 20};

void exchange_all_sizes(int n) {
  Ranks ranks;
  ranks.spawn(n, [&](Channel& ch, int me) {
    std::vector<std::vector<uint64_t>> send, recv;
    std::vector<int> from;
    for (int s = 0; s < 4; ++s) {
      const size_t words = kSizes[s] / 8;
      for (int peer = 0; peer < n; ++peer) {
        if (peer == me) continue;
        recv.emplace_back(words, ~uint64_t{0});
        from.push_back(peer);
        ch.irecv(static_cast<int64_t>(recv.size() - 1), recv.back().data(), kSizes[s], peer,
                 static_cast<uint32_t>(s));
      }
    }
    for (int s = 0; s < 4; ++s) {
      const size_t words = kSizes[s] / 8;
      for (int peer = 0; peer < n; ++peer) {
        if (peer == me) continue;
        send.emplace_back(words);
        for (size_t i = 0; i < words; ++i) send.back()[i] = word(me, peer, s, i);
        ch.isend(1000 + static_cast<int64_t>(send.size() - 1), send.back().data(), kSizes[s], peer,
                 static_cast<uint32_t>(s));
      }
    }
    const auto done = collect(ch, send.size() + recv.size(), 20s);
    ASSERT_EQ(done.size(), send.size() + recv.size()) << "rank " << me;
    for (const auto& c : done) {
      EXPECT_TRUE(c.error.empty()) << message_of(c.error);
      EXPECT_FALSE(c.cancelled);
      if (c.send) continue;
      const auto k = static_cast<size_t>(c.slot);
      const int s = static_cast<int>(k / static_cast<size_t>(n - 1));
      EXPECT_EQ(c.peer, from[k]);
      EXPECT_EQ(c.bytes, kSizes[s]);
    }
    size_t k = 0;
    for (int s = 0; s < 4; ++s)
      for (int i = 0; i < n - 1; ++i, ++k) {
        const auto& r = recv[k];
        size_t bad = 0;
        for (size_t w = 0; w < r.size(); ++w) bad += r[w] != word(from[k], me, s, w);
        EXPECT_EQ(bad, 0u) << "rank " << me << ": " << kSizes[s] << " B from rank " << from[k];
      }
    barrier(ch, ranks.shared(), n, 1);
  });
  ranks.join();
}

TEST(UcxTagged, AllSizesTwoRanks) {
  exchange_all_sizes(2);
}
TEST(UcxTagged, AllSizesThreeRanks) {
  exchange_all_sizes(3);
}
TEST(UcxTagged, AllSizesFourRanks) {
  exchange_all_sizes(4);
}

TEST(UcxTagged, AnySourceReportsTheSender) {
  constexpr int n = 4;
  Ranks ranks;
  ranks.spawn(n, [&](Channel& ch, int me) {
    if (me == 0) {
      std::vector<int64_t> got(n - 1, -1);
      for (int i = 0; i < n - 1; ++i) ch.irecv(i, &got[static_cast<size_t>(i)], 8, kAnySource, 7);
      const auto done = collect(ch, n - 1);
      ASSERT_EQ(done.size(), size_t{n - 1});
      std::vector<int> sources;
      for (const auto& c : done) {
        EXPECT_TRUE(c.error.empty()) << message_of(c.error);
        EXPECT_EQ(c.bytes, 8u);
        EXPECT_EQ(got[static_cast<size_t>(c.slot)], 100 + c.peer) << "slot " << c.slot;
        sources.push_back(c.peer);
      }
      std::sort(sources.begin(), sources.end());
      EXPECT_EQ(sources, (std::vector<int>{1, 2, 3}));
    } else {
      const int64_t value = 100 + me;
      ch.isend(0, &value, 8, 0, 7);
      const auto done = collect(ch, 1);
      ASSERT_EQ(done.size(), 1u);
      EXPECT_TRUE(done[0].error.empty()) << message_of(done[0].error);
    }
    barrier(ch, ranks.shared(), n, 1);
  });
  ranks.join();
}

TEST(UcxTagged, ProbeThenMatchedReceiveOfUnknownSize) {
  Ranks ranks;
  ranks.spawn(3, [&](Channel& ch, int me) {
    // Ranks 1 and 2 send 100003 and 200006 bytes with tag 3 (rank 1 also
    // with the point-to-point space, which rank 0 must not see as tag 3).
    if (me != 0) {
      std::vector<uint8_t> data(static_cast<size_t>(100003 * me));
      for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + me);
      ch.isend(0, data.data(), data.size(), 0, 3);
      uint8_t other = 1;
      if (me == 1) ch.isend(1, &other, 1, 0, 3, engine::Space::point_to_point);
      const auto done = collect(ch, me == 1 ? 2 : 1);
      EXPECT_EQ(done.size(), me == 1 ? 2u : 1u);
    } else {
      // Rank 2 first by name, then whoever comes.
      for (int want : {2, kAnySource}) {
        ProbedMessage m;
        const auto deadline = Clock::now() + 15s;
        while (!ch.improbe(want, 3, engine::Space::collective, &m) && Clock::now() < deadline)
          ch.wait(10ms);
        ASSERT_NE(m.message.bits, 0u) << "no message from " << want;
        // The sender's rank is in the size (and comes with the completion).
        const int source = static_cast<int>(m.bytes / 100003);
        EXPECT_EQ(m.bytes, static_cast<size_t>(100003 * source));
        if (want != kAnySource) {
          EXPECT_EQ(source, want);
        } else {
          EXPECT_EQ(source, 1);
        }
        std::vector<uint8_t> data(m.bytes);
        ch.imrecv(5, data.data(), data.size(), m);
        EXPECT_EQ(m.message.bits, 0u);
        const auto done = collect(ch, 1);
        ASSERT_EQ(done.size(), 1u);
        EXPECT_TRUE(done[0].error.empty()) << message_of(done[0].error);
        EXPECT_EQ(done[0].slot, 5);
        EXPECT_EQ(done[0].peer, source);
        EXPECT_EQ(done[0].bytes, m.bytes);
        size_t bad = 0;
        for (size_t i = 0; i < data.size(); ++i)
          bad += data[i] != static_cast<uint8_t>(i * 7 + source);
        EXPECT_EQ(bad, 0u);
      }
      uint8_t other = 0;
      ch.irecv(9, &other, 1, 1, 3, engine::Space::point_to_point);
      const auto done = collect(ch, 1);
      ASSERT_EQ(done.size(), 1u);
      EXPECT_EQ(other, 1);
    }
    barrier(ch, ranks.shared(), 3, 1);
  });
  ranks.join();
}

TEST(UcxTagged, CancelledReceiveReportsCancelled) {
  Ranks ranks;
  ranks.spawn(2, [&](Channel& ch, int me) {
    uint64_t never = 0;
    const int id = ch.irecv(42, &never, 8, 1 - me, 99);
    const int any = ch.irecv(43, &never, 8, kAnySource, 98);
    ch.cancel(id);
    ch.cancel(any);
    const auto done = collect(ch, 2);
    ASSERT_EQ(done.size(), 2u);
    for (const auto& c : done) {
      EXPECT_TRUE(c.cancelled);
      EXPECT_TRUE(c.error.empty()) << message_of(c.error);
      EXPECT_EQ(c.bytes, 0u);
    }
    EXPECT_EQ(ch.pending(), 0u);
    barrier(ch, ranks.shared(), 2, 1);
  });
  ranks.join();
}

// Transport::test() on one request, a truncated message, and detach(): a
// detached receive never reports, and the message it would have taken
// goes to the next receive.
TEST(UcxTagged, TestTruncationAndDetach) {
  Ranks ranks;
  ranks.spawn(2, [&](Channel& ch, int me) {
    auto& t = ch.transport();
    auto& ep = ch.endpoints();
    const int peer = 1 - me;
    int failure = 0;
    engine::Completion c{};
    auto test_one = [&](engine::Request& r) {
      const auto deadline = Clock::now() + 15s;
      while (!t.test(r, c, failure) && Clock::now() < deadline) t.wait(10ms);
      EXPECT_EQ(r, t.null_request());
      EXPECT_EQ(failure, 0);
    };
    if (me == 0) {
      const std::vector<uint32_t> out = {11, 22, 33, 44};
      engine::Request r = ep.isend(engine::Space::point_to_point, out.data(), 16, peer, 5);
      test_one(r);
      EXPECT_EQ(c.error, 0) << t.error_string(c.error);
      EXPECT_EQ(c.source, -1);
      for (uint32_t v : {7u, 8u}) {
        r = ep.isend(engine::Space::point_to_point, &v, 4, peer, 6);
        test_one(r);
        EXPECT_EQ(c.error, 0) << t.error_string(c.error);
      }
    } else {
      uint32_t small[2] = {};
      engine::Request r = ep.irecv(engine::Space::point_to_point, small, 8, peer, 5);
      test_one(r);
      EXPECT_NE(c.error, 0);
      EXPECT_NE(t.error_string(c.error).find("truncated"), std::string::npos)
          << t.error_string(c.error);
      uint32_t lost = 0, kept = 0;
      engine::Request gone = ep.irecv(engine::Space::point_to_point, &lost, 4, peer, 9);
      t.detach(gone);
      EXPECT_EQ(gone, t.null_request());
      engine::Request first = ep.irecv(engine::Space::point_to_point, &kept, 4, peer, 6);
      test_one(first);
      EXPECT_EQ(c.error, 0);
      EXPECT_EQ(c.source, peer);
      EXPECT_EQ(c.bytes, 4u);
      EXPECT_EQ(kept, 7u);
      engine::Request second = ep.irecv(engine::Space::point_to_point, &kept, 4, peer, 6);
      test_one(second);
      EXPECT_EQ(kept, 8u);
      EXPECT_EQ(lost, 0u);
    }
    EXPECT_EQ(t.pending(), 0u);
    barrier(ch, ranks.shared(), 2, 1);
  });
  ranks.join();
}

// Best one-way latency (us) over batches of 8 B round trips between ranks 0 and 1.
double ping_pong_us(Channel& ch, int me, int batches, int per_batch) {
  double best = 1e9;
  uint64_t v = 0, w = 0;
  for (int b = 0; b < batches; ++b) {
    const auto t0 = Clock::now();
    for (int i = 0; i < per_batch; ++i) {
      std::vector<Completion> out;
      if (me == 0) {
        ch.isend(0, &v, 8, 1, 1);
        ch.irecv(1, &w, 8, 1, 1);
      } else {
        ch.irecv(1, &w, 8, 0, 1);
        while (ch.testsome(out) == 0) {
        }
        ch.isend(0, &v, 8, 0, 1);
      }
      while (out.size() < 2) ch.testsome(out);
    }
    const double us =
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / per_batch / 2;
    best = std::min(best, us);
  }
  return best;
}

void check_transport(bool share_memory) {
  Ranks ranks;
  EndpointOptions options;
  options.share_memory = share_memory;
  ranks.spawn(
      2,
      [&](Channel& ch, int me) {
        const int peer = 1 - me;
        EXPECT_EQ(ch.same_host(peer), share_memory);
        const double us = ping_pong_us(ch, me, 20, 200);
        const std::string info = ch.endpoint_info(peer);
        // UCX's shared-memory transports: posix, sysv, xpmem (mm) and cma
        // for rendezvous.
        const bool shm = info.find("posix/") != std::string::npos ||
                         info.find("sysv/") != std::string::npos ||
                         info.find("xpmem/") != std::string::npos;
        if (me == 0)
          std::printf(
              "share_memory=%d: 8 B one-way latency %.2f us (best batch of 200 round "
              "trips)\n%s",
              share_memory, us, info.c_str());
        EXPECT_EQ(shm, share_memory) << info;
        if (share_memory) {
          EXPECT_LT(us, 5.0) << info;
        }
        barrier(ch, ranks.shared(), 2, 1);
      },
      options);
  ranks.join();
}

TEST(UcxEndpoints, SameHostPeersUseSharedMemory) {
  check_transport(true);
}
TEST(UcxEndpoints, PeerErrorHandlingUsesTcp) {
  check_transport(false);
}

// Rank 2 of 3 is killed while ranks 0 and 1 have a 16 MiB send to it, a
// receive from it and a receive from each other pending (sleeping on the
// event fd): the requests to and from rank 2 fail within 0.5 s, naming it;
// the others stay pending and then complete.
void check_kill(bool share_memory) {
  constexpr int n = 3;
  constexpr int victim = 2;
  Ranks ranks;
  EndpointOptions options;
  options.share_memory = share_memory;
  ranks.spawn(
      n,
      [&](Channel& ch, int me) {
        Shared& s = ranks.shared();
        if (me == victim) {
          barrier(ch, s, n, 1);
          s.ready.fetch_add(1);
          for (;;) ch.wait(100ms);
        }
        barrier(ch, s, n, 1);
        const int other = 1 - me;
        std::vector<uint8_t> big(16 << 20, static_cast<uint8_t>(me));
        uint64_t from_victim = 0, from_other = 0;
        ch.isend(1, big.data(), big.size(), victim, 1);
        ch.irecv(2, &from_victim, 8, victim, 2);
        ch.irecv(3, &from_other, 8, other, 3);
        std::vector<Completion> out;
        for (int i = 0; i < 20; ++i) ch.testsome(out);
        EXPECT_TRUE(out.empty());
        s.ready.fetch_add(1);
        // The survivor's own message (slot 3) may come before the victim's
        // requests fail: it is set aside.
        std::vector<Completion> done, all;
        const auto deadline = Clock::now() + 5s;
        while (done.size() < 2 && Clock::now() < deadline) {
          if (ch.testsome(all) == 0) ch.wait(2s);  // woken by the fd, not the timeout
          for (auto& c : all) (c.slot == 3 ? out : done).push_back(c);
          all.clear();
        }
        const double elapsed_s = static_cast<double>(monotonic_ns() - s.signal_ns.load()) * 1e-9;
        ASSERT_EQ(done.size(), 2u) << "rank " << me;
        for (const auto& c : done) {
          EXPECT_EQ(c.peer, victim);
          ASSERT_FALSE(c.error.empty()) << "slot " << c.slot;
          EXPECT_NE(message_of(c.error).find("rank 2"), std::string::npos) << message_of(c.error);
        }
        EXPECT_LT(elapsed_s, 0.5) << "rank " << me;
        std::printf("rank %d: killed rank 2 reported after %.1f ms (%s): %s\n", me, elapsed_s * 1e3,
                    share_memory ? "same host, pidfd" : "peer error handling",
                    message_of(done[0].error).c_str());
        const auto lost = ch.take_lost_peers();
        ASSERT_EQ(lost.size(), 1u);
        EXPECT_EQ(lost[0].rank, victim);
        EXPECT_EQ(ch.peer_state(victim), PeerState::kLost);
        // A request to a lost peer fails at once; the survivors go on.
        uint64_t v = 0;
        ch.isend(4, &v, 8, victim, 4);
        const uint64_t mine = 500 + static_cast<uint64_t>(me);
        ch.isend(5, &mine, 8, other, 3);
        done = collect(ch, 3 - out.size());
        done.insert(done.end(), out.begin(), out.end());
        ASSERT_EQ(done.size(), 3u);
        for (const auto& c : done) {
          if (c.slot == 4) {
            EXPECT_FALSE(c.error.empty());
          } else {
            EXPECT_TRUE(c.error.empty()) << message_of(c.error);
          }
        }
        EXPECT_EQ(from_other, 500u + static_cast<uint64_t>(other));
        barrier(ch, s, n - 1, 2);
      },
      options);
  ranks.await_ready(n);
  std::this_thread::sleep_for(50ms);
  ranks.signal(victim, SIGKILL);
  ranks.join(25s, {victim});
}

TEST(UcxFailure, KilledSameHostPeerFailsItsRequests) {
  check_kill(true);
}
TEST(UcxFailure, KilledPeerWithErrorHandlingFailsItsRequests) {
  check_kill(false);
}

// A stopped same-host peer is alive to the kernel: the layer reports it as
// stopped and fails nothing; the caller's fail_peer() (a heartbeat's verdict)
// fails its requests at once.
TEST(UcxFailure, StoppedSameHostPeerWaitsForTheCallersVerdict) {
  Ranks ranks;
  ranks.spawn(2, [&](Channel& ch, int me) {
    Shared& s = ranks.shared();
    barrier(ch, s, 2, 1);
    if (me == 1) {
      s.ready.fetch_add(1);
      for (;;) ch.wait(100ms);
    }
    std::vector<uint8_t> big(16 << 20, 1);
    uint64_t from_peer = 0;
    ch.isend(1, big.data(), big.size(), 1, 1);
    ch.irecv(2, &from_peer, 8, 1, 2);
    s.ready.fetch_add(1);
    while (s.signal_ns.load() == 0) ch.wait(1ms);
    std::vector<Completion> done;
    const auto until = Clock::now() + 1s;
    while (Clock::now() < until) ch.wait(50ms), ch.testsome(done);
    EXPECT_TRUE(done.empty());
    EXPECT_EQ(ch.peer_state(1), PeerState::kStopped);
    const auto t0 = Clock::now();
    ch.fail_peer(1, "no heartbeat for 1 s");
    ch.testsome(done);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    ASSERT_EQ(done.size(), 2u);
    for (const auto& c : done) {
      ASSERT_FALSE(c.error.empty());
      EXPECT_NE(message_of(c.error).find("rank 1"), std::string::npos) << message_of(c.error);
      EXPECT_NE(message_of(c.error).find("no heartbeat"), std::string::npos);
    }
    EXPECT_LT(ms, 50.0);
    std::printf(
        "stopped rank 1: not reported by the layer in 1 s (state: stopped); fail_peer "
        "failed its 2 requests in %.2f ms: %s\n",
        ms, message_of(done[0].error).c_str());
    s.ready.fetch_add(1);
  });
  ranks.await_ready(2);
  ranks.signal(1, SIGSTOP);
  ranks.await_ready(3);
  ranks.signal(1, SIGKILL);
  ranks.join(25s, {1});
}

// A receive that matched before its peer was failed is written by UCX until
// the message ends: it is reported (failed) only after its last byte, never
// while UCX may still write the buffer; or, when the sender's process ends
// instead (`sender_ends`), once it is gone (the liveness check's period plus
// slack). Eager fragments only (no rendezvous): the sender pushes what the
// shared-memory FIFO takes, then stops progressing until the receiver failed
// it.
void check_half_sent_receive(bool sender_ends) {
  ASSERT_EQ(setenv("UCX_RNDV_THRESH", "inf", 1), 0);
  Ranks ranks;
  constexpr size_t kWords = size_t{4} << 17;  // 4 MiB
  ranks.spawn(2, [&](Channel& ch, int me) {
    Shared& s = ranks.shared();
    barrier(ch, s, 2, 1);
    std::vector<uint64_t> data(kWords);
    const auto word = [](size_t i) { return (uint64_t{1} << 56) | i; };
    if (me == 1) {
      for (size_t i = 0; i < kWords; ++i) data[i] = word(i);
      ch.isend(1, data.data(), kWords * 8, 0, 7);
      const auto deadline = Clock::now() + 15s;
      while (s.ready.load() < 1 && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
      if (sender_ends) std::_Exit(0);  // with its message half sent
      std::vector<Completion> done;
      while (done.empty() && Clock::now() < deadline) ch.testsome(done);
      ASSERT_EQ(done.size(), 1u);
      while (s.ready.load() < 2 && Clock::now() < deadline) ch.wait(10ms);
      return;
    }
    ch.irecv(1, data.data(), kWords * 8, 1, 7);
    std::vector<Completion> done;
    auto deadline = Clock::now() + 10s;
    while (data[0] == 0 && Clock::now() < deadline) ch.testsome(done);
    ASSERT_NE(data[0], 0u) << "no fragment arrived";
    ASSERT_EQ(data[kWords - 1], 0u) << "the whole message arrived at once";
    ch.fail_peer(1, "no heartbeat");
    ASSERT_EQ(ch.take_lost_peers().size(), 1u);
    // (The sender's own call may still be pushing fragments: a report that
    // comes now must come after the last of them.)
    const auto quiet = Clock::now() + 300ms;
    while (done.empty() && Clock::now() < quiet) ch.testsome(done);
    EXPECT_FALSE(!done.empty() && data[kWords - 1] == 0) << "reported with the message unfinished";
    const auto released = Clock::now();
    s.ready.fetch_add(1);
    deadline = Clock::now() + 10s;
    while (done.empty() && Clock::now() < deadline) ch.testsome(done);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_NE(message_of(done[0].error).find("rank 1"), std::string::npos) << done[0].error;
    if (sender_ends) {
      EXPECT_LT(Clock::now() - released, 1s);
      return;
    }
    const std::vector<uint64_t> at_report = data;
    for (size_t i = 0; i < kWords; ++i) ASSERT_EQ(at_report[i], word(i)) << "word " << i;
    s.ready.fetch_add(1);
    const auto after = Clock::now() + 200ms;
    while (Clock::now() < after) ch.progress();
    EXPECT_TRUE(data == at_report);
  });
  unsetenv("UCX_RNDV_THRESH");
  ranks.join(25s);
}

TEST(UcxFailure, MatchedReceiveOfAFailedPeerIsReportedAfterItsLastByte) {
  check_half_sent_receive(false);
}

TEST(UcxFailure, MatchedReceiveOfAFailedPeerIsReportedWhenItsSenderEnds) {
  check_half_sent_receive(true);
}

// An idle channel sleeps on its event fd: a second of waiting costs well
// under 50 ms of CPU time (every thread of the process, UCX's included).
TEST(UcxProgress, IdleWaitDoesNotSpin) {
  Ranks ranks;
  ranks.spawn(2, [&](Channel& ch, int me) {
    // Connected and used first, so the endpoints' lanes exist.
    uint64_t v = 1, w = 0;
    ch.isend(0, &v, 8, 1 - me, 1);
    ch.irecv(1, &w, 8, 1 - me, 1);
    ASSERT_EQ(collect(ch, 2).size(), 2u);
    barrier(ch, ranks.shared(), 2, 1);
    rusage before{}, after{};
    getrusage(RUSAGE_SELF, &before);
    const auto start = Clock::now();
    int wakeups = 0;
    while (Clock::now() - start < 1s) {
      ch.wait(std::chrono::duration_cast<std::chrono::milliseconds>(1s - (Clock::now() - start)) +
              1ms);
      ++wakeups;
    }
    getrusage(RUSAGE_SELF, &after);
    auto us = [](const timeval& t) { return t.tv_sec * 1e6 + t.tv_usec; };
    const double cpu_ms =
        (us(after.ru_utime) - us(before.ru_utime) + us(after.ru_stime) - us(before.ru_stime)) / 1e3;
    std::printf("rank %d: 1 s idle wait used %.2f ms of CPU in %d wakeups\n", me, cpu_ms, wakeups);
    EXPECT_LT(cpu_ms, 50.0);
    barrier(ch, ranks.shared(), 2, 2);
    // A message wakes a sleeping rank: rank 1 sends 50 ms after the
    // barrier, rank 0 sleeps with a 5 s timeout.
    if (me == 1) {
      std::this_thread::sleep_for(50ms);
      ch.isend(2, &v, 8, 0, 2);
      EXPECT_EQ(collect(ch, 1).size(), 1u);
    } else {
      uint64_t got = 0;
      ch.irecv(2, &got, 8, 1, 2);
      std::vector<Completion> out;
      const auto t0 = Clock::now();
      while (ch.testsome(out) == 0 && Clock::now() - t0 < 10s) ch.wait(5s);
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      std::printf("rank 0: woken by a message after %.1f ms (sent after 50 ms)\n", ms);
      ASSERT_EQ(out.size(), 1u);
      EXPECT_EQ(got, 1u);
      EXPECT_LT(ms, 1000.0);
    }
    barrier(ch, ranks.shared(), 2, 3);
  });
  ranks.join();
}

// Figures for docs (run by hand): 8 B latency, 1 MiB and 16 MiB streams.
//   ucx_test --gtest_also_run_disabled_tests --gtest_filter='*Measure*'
TEST(UcxMeasure, DISABLED_LatencyAndThroughput) {
  Ranks ranks;
  ranks.spawn(2, [&](Channel& ch, int me) {
    const double us = ping_pong_us(ch, me, 50, 1000);
    if (me == 0) std::printf("8 B: one-way latency %.2f us (round trip %.2f us)\n", us, 2 * us);
    for (size_t bytes : {size_t{1} << 20, size_t{16} << 20}) {
      const int count = bytes == (size_t{1} << 20) ? 512 : 64;
      constexpr int window = 4;
      std::vector<std::vector<uint8_t>> bufs(window, std::vector<uint8_t>(bytes, 3));
      barrier(ch, ranks.shared(), 2, bytes == (size_t{1} << 20) ? 1 : 2);
      const auto t0 = Clock::now();
      int posted = 0, finished = 0;
      std::vector<Completion> out;
      while (finished < count) {
        while (posted < count && posted - finished < window) {
          auto& b = bufs[static_cast<size_t>(posted % window)];
          if (me == 0)
            ch.isend(posted, b.data(), bytes, 1, 2);
          else
            ch.irecv(posted, b.data(), bytes, 0, 2);
          ++posted;
        }
        out.clear();
        finished += static_cast<int>(ch.testsome(out));
      }
      uint64_t ack = 0;
      if (me == 1)
        ch.isend(0, &ack, 8, 0, 3);
      else
        ch.irecv(0, &ack, 8, 1, 3);
      collect(ch, 1);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (me == 0)
        std::printf("%zu MiB x %d, window %d: %.2f GB/s\n", bytes >> 20, count, window,
                    static_cast<double>(bytes) * count / s / 1e9);
    }
    barrier(ch, ranks.shared(), 2, 3);
  });
  ranks.join(60s);
}

}  // namespace
}  // namespace relaxcc::ucx

int main(int argc, char** argv) {
  // One machine: without this UCX adds a lane over eth0 to its own address.
  setenv("UCX_NET_DEVICES", "lo", 0);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
