// The UCX layer's context and worker (ucp).
#pragma once

#include <ucp/api/ucp.h>

#include <memory>
#include <string>
#include <string_view>

#include "src/ucx/peer_blob.h"

namespace relaxcc::ucx {

// Throws CommunicationError "<what> failed: <UCX's reason>" unless `status` is UCS_OK.
void check_ucs(ucs_status_t status, std::string_view what);

// A ucp context with the tagged API and wakeup (event fd) features. Workers
// of one context may be progressed by different threads at once.
class Context {
 public:
  // `net_devices`: UCX_NET_DEVICES for this context ("": UCX's default or the
  // user's variable); the caller decides whether the user's variables win.
  // `heartbeats`: the engine's heartbeats judge silent peers, so UCX's own
  // keepalive is off unless the user's UCX_KEEPALIVE_INTERVAL sets it.
  explicit Context(const std::string& net_devices = {}, bool heartbeats = true);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  ucp_context_h get() const { return context_; }

 private:
  ucp_context_h context_ = nullptr;
};

// One ucp worker: the progress engine of one transport.
//
// Thread mode UCS_THREAD_MODE_SERIALIZED: the engine calls it from whichever
// thread holds its progress token (a waiting caller or the engine thread),
// never from two at once, and the token's hand-over orders the calls. SINGLE
// would require every call to come from the creating thread; MULTI would add
// a lock to every call that the token makes useless.
class Worker {
 public:
  explicit Worker(std::shared_ptr<Context> context);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  ucp_worker_h get() const { return worker_; }
  // What peers need to reach this worker (PeerBlob::encode()), with
  // `liveness`'s address when given (an endpoint set's heartbeat socket).
  Blob blob(const engine::UdpSocket* liveness = nullptr) const;
  // One round of ucp progress; the number of events it handled.
  unsigned progress() { return ucp_worker_progress(worker_); }
  // The worker's event fd: readable when ucp has work for progress().
  int event_fd() const { return event_fd_; }
  // Arms the event fd for a sleep. False: events are pending, so progress
  // and try again before sleeping.
  bool arm();

 private:
  std::shared_ptr<Context> context_;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
  PeerBlob self_;
};

}  // namespace relaxcc::ucx
