// TagChannel: tagged messages between the ranks of one endpoint set over one
// ucp worker, with requests kept in slots as the engine keeps MPI's.
//
// Endpoints: a peer on this host (same HostIdentity) gets an endpoint without
// peer error handling, so that UCX uses shared memory for it (UCX 1.13 turns
// shared memory off under UCP_ERR_HANDLING_MODE_PEER); its liveness is
// watched through a pidfd of its process. A peer on another host gets
// UCP_ERR_HANDLING_MODE_PEER and an error callback. Either way a lost peer
// (its endpoint failed, its process ended, or fail_peer() was called) fails
// every request to or from it at once with an error naming its rank;
// receives posted for it are cancelled, since UCX never fails a receive by
// itself. A stopped process (SIGSTOP) is alive to the kernel: the layer
// reports it as PeerState::kStopped but fails nothing; the caller's
// heartbeats decide, and call fail_peer().
//
// Progress happens only inside calls (progress(), testsome(), wait()). Every
// call must come from one thread at a time (the engine's progress token).
#pragma once

#include <sys/types.h>
#include <ucp/api/ucp.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "src/ucx/peer_blob.h"
#include "src/ucx/tag_layout.h"
#include "src/ucx/worker.h"

namespace relaxcc::ucx {

struct ChannelOptions {
  // The endpoint set's generation (tag_layout.h): messages of other
  // generations never match.
  uint32_t generation = 0;
  // False: every peer gets peer error handling (TCP), as across hosts.
  bool share_memory = true;
  // How long the destructor waits for its endpoints to flush before it
  // closes them by force.
  std::chrono::milliseconds close_timeout{1000};
};

// A finished request, as testsome() reports it.
struct Completion {
  int request = -1;  // what isend/irecv/imrecv returned
  int64_t slot = 0;  // the caller's slot, as posted
  int peer = -1;     // sends: the destination; receives: the sender
  size_t bytes = 0;  // sends: the bytes sent; receives: the bytes received
  bool send = false;
  bool cancelled = false;    // a receive that cancel() stopped
  std::exception_ptr error;  // a lost peer, a truncated message, a UCX failure
};

// A message found by improbe() and taken off the worker: receive it with
// imrecv(), which every probed message needs.
struct ProbedMessage {
  ucp_tag_message_h handle = nullptr;
  int source = -1;
  uint32_t tag = 0;
  size_t bytes = 0;
};

enum class PeerState { kAlive, kStopped, kLost };

// A peer the channel gave up on, and why.
struct LostPeer {
  int rank = -1;
  std::string reason;
};

class TagChannel {
 public:
  // `blobs[r]` is rank r's Worker::blob() (this rank's own included).
  TagChannel(std::shared_ptr<Worker> worker, const std::vector<Blob>& blobs, int rank,
             ChannelOptions options = {});
  ~TagChannel();
  TagChannel(const TagChannel&) = delete;
  TagChannel& operator=(const TagChannel&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(peers_.size()); }

  // Posts a send of `bytes` at `buf` to `peer` (which may be this rank);
  // returns the request's id. `buf` stays untouched until it completes.
  int isend(int64_t slot, const void* buf, size_t bytes, int peer, uint32_t tag,
            TagSpace space = TagSpace::kCollective);
  // Posts a receive of at most `bytes` from `peer` or kAnySource; a longer
  // message fails it (truncated).
  int irecv(int64_t slot, void* buf, size_t bytes, int peer, uint32_t tag,
            TagSpace space = TagSpace::kCollective);
  // Matched probe: takes a waiting message from `peer` (or kAnySource) with
  // `tag` off the worker, so a receive can be sized to it.
  bool improbe(int peer, uint32_t tag, TagSpace space, ProbedMessage* message);
  // Receives a probed message into `buf` (at least message.bytes long).
  int imrecv(int64_t slot, void* buf, size_t bytes, const ProbedMessage& message);
  // Cancels a pending receive: it completes with `cancelled` unless a
  // message matched it first. Requests already finished are left alone.
  void cancel(int request);

  // Progresses the worker and appends the requests finished since the last
  // call to `out` (each reported once; its id is free again). The number
  // appended.
  size_t testsome(std::vector<Completion>& out);
  // Requests posted and not yet reported by testsome().
  size_t pending() const { return pending_; }

  // One round of progress: ucp's, endpoint errors, same-host liveness.
  void progress();
  // Gives up on `peer`: fails its requests (PeerLost naming it, with
  // `reason`), closes its endpoint by force. Later requests for it fail at
  // once. For a silent peer (a missed heartbeat, a stopped process).
  void fail_peer(int peer, const std::string& reason);
  // Peers lost since the last call, in the order they were lost.
  std::vector<LostPeer> take_lost_peers();
  PeerState peer_state(int peer) const;
  bool same_host(int peer) const { return peers_.at(static_cast<size_t>(peer)).same_host; }
  // ucp's description of the endpoint to `peer`: its lanes and transports.
  std::string endpoint_info(int peer) const;

  // Readable when progress() has work: ucp events or a same-host peer's end.
  int event_fd() const { return epoll_fd_; }
  // Prepares event_fd() for a sleep. False: work is pending (progress first).
  bool arm();
  // Progresses; when nothing is ready, sleeps on event_fd() for at most
  // `timeout`. True when something happened (events, completions).
  bool wait(std::chrono::milliseconds timeout);

 private:
  struct Peer {
    TagChannel* owner = nullptr;
    int rank = -1;
    ucp_ep_h ep = nullptr;
    bool same_host = false;
    ProcessIdentity process;
    int pidfd = -1;
    bool lost = false;
    std::exception_ptr error;
  };
  enum class EntryState : uint8_t { kFree, kPending, kReady };
  struct Entry {
    TagChannel* owner = nullptr;
    int id = -1;
    EntryState state = EntryState::kFree;
    bool send = false;
    int64_t slot = 0;
    int peer = -1;
    size_t bytes = 0;
    void* request = nullptr;
    ucs_status_t status = UCS_OK;
    ucp_tag_recv_info_t info{};
    std::exception_ptr error;
  };

  static void on_send(void* request, ucs_status_t status, void* user_data);
  static void on_recv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                      void* user_data);
  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  void connect(const std::vector<Blob>& blobs);
  Peer& peer_at(int peer, const char* what);
  Entry& allocate(int64_t slot, int peer, size_t bytes, bool send);
  // Files the result of a ucp call that posted `e`'s request.
  int posted(Entry& e, ucs_status_ptr_t result);
  void make_ready(Entry& e);
  void check_liveness(bool now);
  void close_endpoints();
  Completion complete(Entry& e);

  std::shared_ptr<Worker> worker_;
  int rank_;
  ChannelOptions options_;
  std::vector<Peer> peers_;
  std::deque<Entry> entries_;
  std::vector<int> free_;
  std::vector<int> ready_;
  size_t pending_ = 0;
  std::vector<LostPeer> lost_;
  std::vector<std::pair<int, std::string>> endpoint_errors_;
  std::vector<void*> closing_;
  int epoll_fd_ = -1;             // the worker's fd and liveness_fd_
  int liveness_fd_ = -1;          // the pidfds of same-host peers
  bool liveness_polled_ = false;  // no pidfds: /proc is read instead
  std::chrono::steady_clock::time_point next_liveness_check_{};
};

}  // namespace relaxcc::ucx
