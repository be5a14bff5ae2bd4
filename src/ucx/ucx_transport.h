// The UCX wing's Transport and Endpoints (src/engine/transport.h) over ucp's
// tagged API.
//
// UcxTransport: one ucp worker (one per engine) and the requests posted on it.
// UcxEndpoints: one endpoint set over it, built from every rank's address
// blob (Worker::blob(), exchanged by the caller: a rendezvous store, a file).
//
// Endpoints. A peer on this host (same HostIdentity) gets an endpoint without
// peer error handling, so that UCX uses shared memory for it (UCX 1.13 turns
// shared memory off under UCP_ERR_HANDLING_MODE_PEER); the transport watches
// its process through a pidfd (the pid and its start time name the process,
// so a reused pid is no false hope). A peer on another host gets
// UCP_ERR_HANDLING_MODE_PEER and an error callback. Either way a lost peer
// (its endpoint failed, its process ended, or fail_peer() was called) fails
// every request to or from it at once: its Completion::error names the rank
// (error_string()), receives posted for it are cancelled (UCX never fails a
// receive by itself), its endpoint is closed by force, and the transport
// reports a PeerError. No completion reported for a request touches its
// buffer afterwards: a receive whose message matched already (UCX cannot
// cancel it) from a same-host peer whose process still runs is reported,
// failed, only when UCX finished writing it or that process ended (a peer on
// another host writes nothing once its endpoint is closed). A stopped process (SIGSTOP) is alive to
// the kernel: peer_state() says kStopped but nothing fails until the caller's heartbeats decide and
// call fail_peer().
//
// Progress happens only inside calls (test_some(), test()). The event fd is
// an epoll set of the worker's fd and the same-host peers' pidfds: an idle
// engine sleeps on it and wakes for messages and for a peer's end alike.
// Every call takes the transport's lock, so calls may come from any thread;
// the worker itself is UCS_THREAD_MODE_SERIALIZED (worker.h).
#pragma once

#include <sys/types.h>
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "src/engine/transport.h"
#include "src/engine/udp_channel.h"
#include "src/ucx/peer_blob.h"
#include "src/ucx/tag_layout.h"
#include "src/ucx/worker.h"

namespace relaxcc::ucx {

class UcxEndpoints;

class UcxTransport final : public engine::Transport {
 public:
  // `job_rank`: this process's rank for trace files (-1: unknown).
  UcxTransport(std::shared_ptr<Worker> worker, int job_rank);
  ~UcxTransport() override;

  const char* name() const override { return "UCX"; }
  int test_some(int n, engine::Request* requests, int* indices, engine::Completion* completions,
                int& failure) override;
  bool test(engine::Request& request, engine::Completion& completion, int& failure) override;
  void cancel(engine::Request& request) override;
  void detach(engine::Request& request) override;
  std::string error_string(int code) const override;
  bool closed() const override { return false; }
  bool yields_when_idle() const override { return false; }
  int event_fd() const override { return epoll_fd_; }
  bool arm() override;
  int job_rank() const override { return job_rank_; }
  const std::shared_ptr<Worker>& worker() const { return worker_; }

  // Requests posted and not yet reported, detached ones excepted.
  size_t pending() const;
  // Tests: progresses; when nothing is ready, sleeps on event_fd() for at
  // most `timeout`. True when something happened.
  bool wait(std::chrono::milliseconds timeout);

 private:
  friend class UcxEndpoints;
  // kDetached: given up by the caller, still inside UCX until it finishes.
  enum class EntryState : uint8_t { kFree, kProbed, kPending, kReady, kDetached };
  struct Entry {
    UcxTransport* transport = nullptr;
    const UcxEndpoints* endpoints = nullptr;
    EntryState state = EntryState::kFree;
    bool send = false;
    int peer = -1;  // the destination or source (kAnySource)
    size_t bytes = 0;
    void* request = nullptr;              // ucp's, until reported
    ucp_tag_message_h message = nullptr;  // probed, not yet received
    ucs_status_t status = UCS_OK;
    int error = 0;  // a lost peer's code
    ucp_tag_recv_info_t info{};
    // Failed with its peer while its matched message was still arriving from
    // `writer`'s running process: reported only when UCX finished with its
    // buffer (its callback) or that process ended.
    bool held = false;
    ProcessIdentity writer{};
  };
  struct EndpointError {
    const UcxEndpoints* endpoints;
    int rank;
    std::string reason;
  };

  static void on_send(void* request, ucs_status_t status, void* user_data);
  static void on_recv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                      void* user_data);

  // All below: with mutex_ held.
  Entry& allocate(const UcxEndpoints* endpoints, int peer, size_t bytes, bool send);
  engine::Request posted(Entry& e, ucs_status_ptr_t result);
  void make_ready(Entry& e);
  void release(Entry& e);
  void unhold(Entry& e);
  // Reports the held entries whose writer's process ended.
  void check_held();
  engine::Completion complete(Entry& e);
  void progress();
  void check_liveness(bool now);
  // A new error code for `reason` (error_string() returns it).
  int add_reason(std::string reason);
  void watch(int pidfd, void* peer);
  void unwatch(int pidfd);
  // Fails the requests of `endpoints` to or from `rank` with `code`.
  void fail_requests(const UcxEndpoints* endpoints, int rank, int code);
  // Called by ucp (any thread): the endpoint to `rank` failed.
  void endpoint_failed(const UcxEndpoints* endpoints, int rank, std::string reason);
  void forget(const UcxEndpoints* endpoints);
  static Entry& entry_of(engine::Request request);

  std::shared_ptr<Worker> worker_;
  const int job_rank_;
  mutable std::mutex mutex_;
  std::deque<Entry> entries_;
  std::vector<Entry*> free_;
  size_t pending_ = 0;
  size_t ready_ = 0;                        // entries ready and not yet reported
  size_t held_ = 0;                         // entries with `held`
  std::vector<std::string> reasons_;        // error code k > 0: reasons_[k - 1]
  std::vector<UcxEndpoints*> polled_sets_;  // sets with same-host peers without a pidfd
  std::mutex errors_mutex_;                 // endpoint_errors_ (ucp may call from its own thread)
  std::vector<EndpointError> endpoint_errors_;
  int epoll_fd_ = -1;     // the worker's fd and liveness_fd_
  int liveness_fd_ = -1;  // the pidfds of same-host peers
  int polled_peers_ = 0;  // same-host peers without a pidfd: /proc is read for them
  std::chrono::steady_clock::time_point next_liveness_check_{};
};

enum class PeerState { kAlive, kStopped, kLost };

struct EndpointOptions {
  // The endpoint set's generation (tag_layout.h): messages of other
  // generations never match.
  uint32_t generation = 0;
  // False: every peer gets peer error handling (TCP), as across hosts.
  bool share_memory = true;
  // How long the destructor lets its endpoints flush before it closes them
  // by force.
  std::chrono::milliseconds close_timeout{1000};
  // The UDP socket of this set's heartbeats, published in this rank's blob
  // (Worker::blob(*liveness)); null, or a peer without one: heartbeats go
  // over UCX.
  std::shared_ptr<engine::UdpSocket> liveness;
};

class UcxEndpoints final : public engine::Endpoints {
 public:
  // `blobs[r]` is rank r's Worker::blob() (this rank's own included).
  // Throws PeerLost naming a same-host peer whose process is gone already,
  // CorruptPayload for a blob that is not one.
  UcxEndpoints(std::shared_ptr<UcxTransport> transport, const std::vector<Blob>& blobs, int rank,
               EndpointOptions options = {});
  ~UcxEndpoints() override;

  engine::Request isend(engine::Space space, const void* buf, size_t bytes, int peer,
                        int tag) override;
  engine::Request irecv(engine::Space space, void* buf, size_t bytes, int peer, int tag) override;
  bool improbe(engine::Space space, int peer, int tag, engine::Message* message,
               size_t* bytes) override;
  engine::Request imrecv(void* buf, size_t bytes, engine::Message* message) override;

  // Gives up on `peer` (a missed heartbeat, a stopped process): fails its
  // requests, closes its endpoint by force, reports a PeerError. Later
  // requests for it fail at once.
  void fail_peer(int peer, const std::string& reason) override;
  // A UdpChannel over options.liveness when every rank published one.
  std::unique_ptr<engine::LivenessChannel> liveness_channel() override;
  PeerState peer_state(int peer) const;
  bool same_host(int peer) const;
  // ucp's description of the endpoint to `peer`: its lanes and transports.
  std::string endpoint_info(int peer) const;

 private:
  friend class UcxTransport;
  struct Peer {
    UcxEndpoints* owner = nullptr;
    int rank = -1;
    ucp_ep_h ep = nullptr;
    bool same_host = false;
    ProcessIdentity process;
    int pidfd = -1;
    bool polled = false;  // no pidfd: watched through /proc
    int lost = 0;         // the error code of its loss; 0 while alive
  };

  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  UcxTransport& ucx() const { return *ucx_; }
  Peer& peer_at(int peer, const char* what);
  uint64_t tag(engine::Space space, int source, int tag) const;
  // With the transport's lock held.
  void lose(Peer& p, const std::string& reason);
  // Closes every endpoint. `lock` holds the transport's lock; it is let go
  // while the closes flush (at most options_.close_timeout).
  void close_endpoints(std::unique_lock<std::mutex>& lock);

  UcxTransport* ucx_;
  EndpointOptions options_;
  std::vector<Peer> peers_;
  // Every rank's liveness socket (empty: not every rank has one) and the
  // set's token (a hash of every blob).
  std::vector<engine::UdpChannel::Peer> liveness_;
  uint64_t liveness_token_ = 0;
};

// The transport and the endpoint set of one rank, from every rank's blob.
struct UcxConnection {
  std::shared_ptr<UcxTransport> transport;
  std::shared_ptr<UcxEndpoints> endpoints;
};
UcxConnection connect(std::shared_ptr<Worker> worker, const std::vector<Blob>& blobs, int rank,
                      EndpointOptions options = {});

}  // namespace relaxcc::ucx
