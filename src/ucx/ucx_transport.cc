#include "src/ucx/ucx_transport.h"

#include <sys/epoll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <thread>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"

namespace relaxcc::ucx {

namespace {

using Clock = std::chrono::steady_clock;
// How often progress looks at the same-host peers' pidfds (one epoll_wait
// without timeout), and how often it reads /proc where a pidfd is missing.
constexpr auto kPidfdCheckPeriod = std::chrono::milliseconds(1);
constexpr auto kProcCheckPeriod = std::chrono::milliseconds(20);

void epoll_add(int epoll_fd, int fd, void* data) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = data;
  RELAXCC_ENFORCE(epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) == 0, CommunicationError,
                  "UCX: epoll_ctl(ADD) failed: ", std::strerror(errno));
}

std::string process_ended(const ProcessIdentity& p) {
  return detail::concat("its process (pid ", p.pid, ", this host) ended");
}

}  // namespace

// ---- UcxTransport ----------------------------------------------------------

UcxTransport::UcxTransport(std::shared_ptr<Worker> worker, int job_rank)
    : engine::Transport(engine::Request{0}), worker_(std::move(worker)), job_rank_(job_rank) {
  RELAXCC_ENFORCE(worker_ != nullptr, InvalidArgument, "UcxTransport needs a worker");
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  liveness_fd_ = epoll_create1(EPOLL_CLOEXEC);
  try {
    RELAXCC_ENFORCE(epoll_fd_ >= 0 && liveness_fd_ >= 0, CommunicationError,
                    "UCX: epoll_create1 failed: ", std::strerror(errno));
    epoll_add(epoll_fd_, worker_->event_fd(), nullptr);
    epoll_add(epoll_fd_, liveness_fd_, nullptr);
  } catch (...) {
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
    if (liveness_fd_ >= 0) ::close(liveness_fd_);
    throw;
  }
}

UcxTransport::~UcxTransport() {
  // Requests never reported: receives are cancelled, sends go on inside UCX
  // until the worker is destroyed. No callback reaches a freed request.
  for (Entry& e : entries_) {
    void* r = e.request;
    if (r == nullptr) continue;
    if ((e.state == EntryState::kPending || e.state == EntryState::kDetached) && !e.send)
      ucp_request_cancel(worker_->get(), r);
    // A detached entry's callback released it (and its request) already.
    if (e.request == r) ucp_request_free(r);
    e.request = nullptr;
  }
  ::close(epoll_fd_);
  ::close(liveness_fd_);
}

UcxTransport::Entry& UcxTransport::entry_of(engine::Request request) {
  return *reinterpret_cast<Entry*>(request.bits);
}

UcxTransport::Entry& UcxTransport::allocate(const UcxEndpoints* endpoints, int peer, size_t bytes,
                                            bool send) {
  Entry* e;
  if (!free_.empty()) {
    e = free_.back();
    free_.pop_back();
  } else {
    e = &entries_.emplace_back();
  }
  *e = Entry{};
  e->transport = this;
  e->endpoints = endpoints;
  e->state = EntryState::kPending;
  e->send = send;
  e->peer = peer;
  e->bytes = bytes;
  ++pending_;
  return *e;
}

void UcxTransport::make_ready(Entry& e) {
  unhold(e);
  e.state = EntryState::kReady;
  ++ready_;
}

void UcxTransport::unhold(Entry& e) {
  if (!e.held) return;
  e.held = false;
  --held_;
}

void UcxTransport::release(Entry& e) {
  unhold(e);
  if (e.request != nullptr) ucp_request_free(e.request);
  if (e.state == EntryState::kReady) --ready_;
  if (e.state == EntryState::kReady || e.state == EntryState::kPending) --pending_;
  e = Entry{};
  free_.push_back(&e);
}

void UcxTransport::on_send(void*, ucs_status_t status, void* user_data) {
  auto& e = *static_cast<Entry*>(user_data);
  if (e.state == EntryState::kDetached) return e.transport->release(e);
  if (e.state != EntryState::kPending) return;
  e.status = status;
  e.transport->make_ready(e);
}

void UcxTransport::on_recv(void*, ucs_status_t status, const ucp_tag_recv_info_t* info,
                           void* user_data) {
  auto& e = *static_cast<Entry*>(user_data);
  if (e.state == EntryState::kDetached) return e.transport->release(e);
  if (e.state != EntryState::kPending) return;
  e.status = status;
  if (status == UCS_OK && info != nullptr) e.info = *info;
  e.transport->make_ready(e);
}

engine::Request UcxTransport::posted(Entry& e, ucs_status_ptr_t result) {
  if (result == nullptr) {
    e.status = UCS_OK;
    if (e.state == EntryState::kPending) make_ready(e);
  } else if (UCS_PTR_IS_ERR(result)) {
    e.status = UCS_PTR_STATUS(result);
    if (e.state == EntryState::kPending) make_ready(e);
  } else {
    e.request = result;
  }
  return engine::Request{reinterpret_cast<std::uintptr_t>(&e)};
}

int UcxTransport::add_reason(std::string reason) {
  reasons_.push_back(std::move(reason));
  return static_cast<int>(reasons_.size());
}

std::string UcxTransport::error_string(int code) const {
  if (code == 0) return "success";
  if (code < 0) return detail::concat("UCX: ", ucs_status_string(static_cast<ucs_status_t>(code)));
  std::lock_guard<std::mutex> lock(mutex_);
  if (static_cast<size_t>(code) <= reasons_.size()) return reasons_[static_cast<size_t>(code) - 1];
  return detail::concat("UCX: unknown error code ", code);
}

void UcxTransport::watch(int pidfd, void* peer) {
  epoll_add(liveness_fd_, pidfd, peer);
}

void UcxTransport::unwatch(int pidfd) {
  epoll_ctl(liveness_fd_, EPOLL_CTL_DEL, pidfd, nullptr);
}

void UcxTransport::fail_requests(const UcxEndpoints* endpoints, int rank, int code) {
  for (Entry& e : entries_) {
    if (e.endpoints != endpoints || e.peer != rank) continue;
    if (e.state == EntryState::kDetached) {
      if (!e.send) ucp_request_cancel(worker_->get(), e.request);
      if (e.state == EntryState::kDetached) release(e);
      continue;
    }
    if (e.state != EntryState::kPending || e.held) continue;
    // Marked first: a callback from here on completes it as failed.
    e.error = code;
    if (e.request != nullptr && !e.send) {
      // An unmatched receive's callback runs inside the cancel.
      ucp_request_cancel(worker_->get(), e.request);
      if (e.state != EntryState::kPending) continue;
      // Matched: its message is still being written into the buffer.
      const auto& p = endpoints->peers_[static_cast<size_t>(rank)];
      if (p.same_host && process_status(p.process.pid).runs(p.process)) {
        e.held = true;
        e.writer = p.process;
        ++held_;
        continue;
      }
    }
    make_ready(e);
    if (e.request != nullptr) {
      ucp_request_free(e.request);  // no callback after this
      e.request = nullptr;
    }
  }
}

void UcxTransport::check_held() {
  bool ended = false;
  for (Entry& e : entries_)
    ended = ended || (e.held && !process_status(e.writer.pid).runs(e.writer));
  if (!ended) return;
  // What the ended process wrote before it ended is delivered first.
  while (worker_->progress() != 0) {
  }
  for (Entry& e : entries_) {
    if (!e.held || process_status(e.writer.pid).runs(e.writer)) continue;
    make_ready(e);
    ucp_request_free(e.request);
    e.request = nullptr;
  }
}

void UcxTransport::endpoint_failed(const UcxEndpoints* endpoints, int rank, std::string reason) {
  std::lock_guard<std::mutex> lock(errors_mutex_);
  endpoint_errors_.push_back(EndpointError{endpoints, rank, std::move(reason)});
}

void UcxTransport::forget(const UcxEndpoints* endpoints) {
  {
    std::lock_guard<std::mutex> lock(errors_mutex_);
    std::erase_if(endpoint_errors_,
                  [&](const EndpointError& e) { return e.endpoints == endpoints; });
  }
  for (Entry& e : entries_)
    if (e.endpoints == endpoints) e.endpoints = nullptr;
}

void UcxTransport::check_liveness(bool now) {
  const auto t = Clock::now();
  if (!now && t < next_liveness_check_) return;
  next_liveness_check_ =
      t + (polled_peers_ > 0 || held_ > 0 ? kProcCheckPeriod : kPidfdCheckPeriod);
  epoll_event events[16];
  const int n = epoll_wait(liveness_fd_, events, 16, 0);
  // What an ended process wrote before it ended is delivered first (its
  // last sends of a collective that it completed).
  if (n > 0)
    while (worker_->progress() != 0) {
    }
  for (int i = 0; i < n; ++i) {
    auto& p = *static_cast<UcxEndpoints::Peer*>(events[i].data.ptr);
    p.owner->lose(p, process_ended(p.process));
  }
  if (held_ > 0) check_held();
  if (polled_peers_ == 0) return;
  std::vector<std::pair<UcxEndpoints*, UcxEndpoints::Peer*>> ended;
  for (UcxEndpoints* set : polled_sets_)
    for (auto& p : set->peers_)
      if (p.polled && p.lost == 0 && !process_status(p.process.pid).runs(p.process))
        ended.emplace_back(set, &p);
  if (ended.empty()) return;
  while (worker_->progress() != 0) {  // what they wrote first, as above
  }
  for (auto [set, p] : ended) set->lose(*p, process_ended(p->process));
}

void UcxTransport::progress() {
  while (worker_->progress() != 0) {
  }
  std::vector<EndpointError> errors;
  {
    std::lock_guard<std::mutex> lock(errors_mutex_);
    errors.swap(endpoint_errors_);
  }
  for (auto& e : errors) {
    auto* set = const_cast<UcxEndpoints*>(e.endpoints);
    set->lose(set->peers_[static_cast<size_t>(e.rank)], "its endpoint failed: " + e.reason);
  }
  check_liveness(false);
}

engine::Completion UcxTransport::complete(Entry& e) {
  engine::Completion c{-1, 0, false, 0};  // every field: the type is trivial
  if (e.error != 0) {
    c.error = e.error;
    if (!e.send) c.source = e.peer;
  } else if (e.status == UCS_OK) {
    if (!e.send) {
      c.source = tag_layout::source(e.info.sender_tag);
      c.bytes = e.info.length;
    }
  } else if (e.status == UCS_ERR_CANCELED && !e.send) {
    c.cancelled = true;
  } else if (e.status != UCS_ERR_MESSAGE_TRUNCATED && e.peer != kAnySource &&
             e.endpoints != nullptr) {
    // A transport failure on the way to or from one peer: it is lost.
    auto* set = const_cast<UcxEndpoints*>(e.endpoints);
    auto& p = set->peers_[static_cast<size_t>(e.peer)];
    set->lose(p, detail::concat(e.send ? "a send to it" : "a receive from it",
                                " failed: ", ucs_status_string(e.status)));
    c.error = p.lost != 0 ? p.lost : static_cast<int>(e.status);
    if (!e.send) c.source = e.peer;
  } else {
    c.error = static_cast<int>(e.status);
  }
  release(e);
  return c;
}

int UcxTransport::test_some(int n, engine::Request* requests, int* indices,
                            engine::Completion* completions, int& failure) {
  std::lock_guard<std::mutex> lock(mutex_);
  failure = 0;
  progress();
  int k = 0;
  // complete() may lose a peer, which readies more of the requests.
  for (int i = 0; i < n && ready_ > 0; ++i) {
    if (requests[i].bits == 0) continue;
    Entry& e = entry_of(requests[i]);
    if (e.state != EntryState::kReady) continue;
    completions[k] = complete(e);
    indices[k++] = i;
    requests[i] = null_request();
  }
  return k;
}

bool UcxTransport::test(engine::Request& request, engine::Completion& completion, int& failure) {
  std::lock_guard<std::mutex> lock(mutex_);
  failure = 0;
  if (request == null_request()) {
    completion = engine::Completion{-1, 0, false, 0};
    return true;
  }
  progress();
  Entry& e = entry_of(request);
  if (e.state != EntryState::kReady) return false;
  completion = complete(e);
  request = null_request();
  return true;
}

void UcxTransport::cancel(engine::Request& request) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (request == null_request()) return;
  Entry& e = entry_of(request);
  RELAXCC_ENFORCE(!e.send, InvalidArgument, "UCX cancel: only receives are cancelled");
  if (e.state == EntryState::kPending && e.request != nullptr)
    ucp_request_cancel(worker_->get(), e.request);
}

void UcxTransport::detach(engine::Request& request) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (request == null_request()) return;
  Entry& e = entry_of(request);
  request = null_request();
  if (e.state != EntryState::kPending || e.request == nullptr) return release(e);
  unhold(e);
  // Until UCX finishes it (its callback releases the entry), or the peer is
  // lost, or the transport goes.
  e.state = EntryState::kDetached;
  --pending_;
}

size_t UcxTransport::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pending_;
}

bool UcxTransport::arm() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ready_ > 0 || peer_errors_pending()) return false;
  {
    std::lock_guard<std::mutex> errors_lock(errors_mutex_);
    if (!endpoint_errors_.empty()) return false;
  }
  if (!worker_->arm()) return false;
  check_liveness(true);
  return ready_ == 0 && !peer_errors_pending();
}

bool UcxTransport::wait(std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    progress();
    if (ready_ > 0) return true;
  }
  if (!arm()) return true;
  epoll_event ev{};
  int n;
  do {
    n = epoll_wait(epoll_fd_, &ev, 1, static_cast<int>(timeout.count()));
  } while (n < 0 && errno == EINTR);
  return n > 0;
}

// ---- UcxEndpoints ----------------------------------------------------------

UcxEndpoints::UcxEndpoints(std::shared_ptr<UcxTransport> transport, const std::vector<Blob>& blobs,
                           int rank, EndpointOptions options)
    : engine::Endpoints(transport, rank, static_cast<int>(blobs.size()), INT_MAX),
      ucx_(transport.get()),
      options_(options) {
  RELAXCC_ENFORCE(!blobs.empty() && blobs.size() <= static_cast<size_t>(tag_layout::kMaxRanks),
                  InvalidArgument, "UcxEndpoints: ", blobs.size(),
                  " ranks; the tag layout holds 1 to ", tag_layout::kMaxRanks);
  RELAXCC_ENFORCE(rank >= 0 && static_cast<size_t>(rank) < blobs.size(), InvalidArgument,
                  "UcxEndpoints: rank ", rank, " of ", blobs.size());
  RELAXCC_ENFORCE_LE(options_.generation, tag_layout::kMaxGeneration, InvalidArgument,
                     "UcxEndpoints: generation");
  const PeerBlob self = PeerBlob::decode(blobs[static_cast<size_t>(rank)], rank);
  RELAXCC_ENFORCE(self.process == ProcessIdentity::of_this_process(), InvalidArgument,
                  "UcxEndpoints: blob ", rank, " is not this process's (rank ", rank, ")");
  if (options_.liveness) {
    Fnv1a token;
    std::vector<PeerBlob> all;
    for (size_t r = 0; r < blobs.size(); ++r) {
      all.push_back(PeerBlob::decode(blobs[r], static_cast<int>(r)));
      for (std::byte c : blobs[r]) token.byte(static_cast<unsigned char>(c));
    }
    // Beats to a peer in the sender's network namespace go to the loopback
    // address; to another, to those of its addresses that are not also the
    // sender's (172.17.0.1 of docker0 is on every host). Every rank decides
    // from the same blobs: the set beats over UDP only when every pair of
    // ranks can, else over the transport.
    const auto same_namespace = [](const PeerBlob& a, const PeerBlob& b) {
      return a.host.boot_id == b.host.boot_id && a.host.net_ns == b.host.net_ns;
    };
    // An address of `to` that is not also one of `from`'s.
    const auto foreign = [](const PeerBlob& from) {
      return [&from](uint32_t h) {
        return std::find(from.liveness.hosts.begin(), from.liveness.hosts.end(), h) ==
               from.liveness.hosts.end();
      };
    };
    const bool usable = std::all_of(all.begin(), all.end(), [&](const PeerBlob& from) {
      return std::all_of(all.begin(), all.end(), [&](const PeerBlob& to) {
        return to.liveness.port != 0 &&
               (same_namespace(from, to) ||
                std::any_of(to.liveness.hosts.begin(), to.liveness.hosts.end(), foreign(from)));
      });
    });
    for (const PeerBlob& b : all) {
      engine::UdpAddress address = b.liveness;
      address.hosts.clear();
      if (!same_namespace(self, b))
        std::copy_if(b.liveness.hosts.begin(), b.liveness.hosts.end(),
                     std::back_inserter(address.hosts), foreign(self));
      liveness_.push_back({address, same_namespace(self, b)});
    }
    liveness_token_ = token.value();
    if (!usable) liveness_.clear();
  }
  std::unique_lock<std::mutex> lock(ucx_->mutex_);
  peers_.resize(blobs.size());
  try {
    for (size_t r = 0; r < blobs.size(); ++r) {
      Peer& p = peers_[r];
      p.owner = this;
      p.rank = static_cast<int>(r);
      const PeerBlob b = PeerBlob::decode(blobs[r], p.rank);
      p.same_host = b.host == self.host && (options_.share_memory || p.rank == rank);
      p.process = b.process;
      if (p.same_host && p.rank != rank) {
        p.pidfd = static_cast<int>(syscall(SYS_pidfd_open, p.process.pid, 0));
        // The pidfd names the process only if it still is the one that
        // published the blob (pids are reused).
        if ((p.pidfd < 0 && errno == ESRCH) || !process_status(p.process.pid).runs(p.process))
          throw PeerLost(p.rank,
                         detail::concat("UCX: rank ", p.rank, " (pid ", p.process.pid,
                                        ", this host) is gone before its endpoint was created"),
                         __FILE__, __LINE__);
        if (p.pidfd >= 0) {
          ucx_->watch(p.pidfd, &p);
        } else {
          p.polled = true;
          ++ucx_->polled_peers_;
          if (std::find(ucx_->polled_sets_.begin(), ucx_->polled_sets_.end(), this) ==
              ucx_->polled_sets_.end())
            ucx_->polled_sets_.push_back(this);
        }
      }
      ucp_ep_params_t params{};
      params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
      params.address = reinterpret_cast<const ucp_address_t*>(b.worker_address.data());
      if (p.same_host) {
        params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      } else {
        params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
        params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        params.err_handler.cb = &UcxEndpoints::on_endpoint_error;
        params.err_handler.arg = &p;
      }
      const ucs_status_t status = ucp_ep_create(ucx_->worker_->get(), &params, &p.ep);
      if (status != UCS_OK)
        RELAXCC_THROW(CommunicationError, "UCX: ucp_ep_create to rank ", p.rank,
                      " failed: ", ucs_status_string(status));
    }
  } catch (...) {
    close_endpoints(lock);
    throw;
  }
}

UcxEndpoints::~UcxEndpoints() {
  std::unique_lock<std::mutex> lock(ucx_->mutex_);
  close_endpoints(lock);
}

void UcxEndpoints::close_endpoints(std::unique_lock<std::mutex>& lock) {
  std::vector<void*> closing;
  for (Peer& p : peers_) {
    if (p.pidfd >= 0) {
      ucx_->unwatch(p.pidfd);
      ::close(p.pidfd);
      p.pidfd = -1;
    }
    if (p.polled) --ucx_->polled_peers_;
    p.polled = false;
    if (p.ep == nullptr) continue;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = p.lost != 0 ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    const ucs_status_ptr_t r = ucp_ep_close_nbx(p.ep, &param);
    if (UCS_PTR_IS_PTR(r)) closing.push_back(r);
    p.ep = nullptr;
  }
  std::erase(ucx_->polled_sets_, this);
  const auto deadline = Clock::now() + options_.close_timeout;
  while (!closing.empty()) {
    ucx_->worker_->progress();
    std::erase_if(closing, [](void* r) {
      if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
      ucp_request_free(r);
      return true;
    });
    if (Clock::now() > deadline) {
      // Peers that never answer: the worker's destruction releases these.
      for (void* r : closing) ucp_request_free(r);
      closing.clear();
    }
    if (closing.empty()) break;
    // Other threads may post and test meanwhile (this set's peers are
    // closed: nothing of it is watched or polled any more).
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    lock.lock();
  }
  ucx_->forget(this);
}

void UcxEndpoints::on_endpoint_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto& p = *static_cast<Peer*>(arg);
  // Inside ucp's progress: lose() closes the endpoint, so it runs after.
  p.owner->ucx_->endpoint_failed(p.owner, p.rank, ucs_status_string(status));
}

UcxEndpoints::Peer& UcxEndpoints::peer_at(int peer, const char* what) {
  RELAXCC_ENFORCE(peer >= 0 && peer < size(), InvalidArgument, "UCX ", what, ": rank ", peer,
                  " is not one of 0..", size() - 1);
  return peers_[static_cast<size_t>(peer)];
}

uint64_t UcxEndpoints::tag(engine::Space space, int source, int t) const {
  RELAXCC_ENFORCE(t >= 0, InvalidArgument, "UCX: tag ", t, " is negative");
  return tag_layout::make(
      space == engine::Space::collective ? TagSpace::kCollective : TagSpace::kPointToPoint,
      options_.generation, source, static_cast<uint32_t>(t));
}

void UcxEndpoints::lose(Peer& p, const std::string& reason) {
  if (p.lost != 0 || p.rank == rank()) return;
  p.lost = ucx_->add_reason(detail::concat("UCX: rank ", p.rank, " lost: ", reason));
  ucx_->fail_requests(this, p.rank, p.lost);
  if (p.ep != nullptr) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    const ucs_status_ptr_t r = ucp_ep_close_nbx(p.ep, &param);
    if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
    p.ep = nullptr;
  }
  if (p.pidfd >= 0) {
    ucx_->unwatch(p.pidfd);
    ::close(p.pidfd);
    p.pidfd = -1;
  }
  ucx_->report_peer_error(engine::PeerError{this, p.rank, reason});
}

void UcxEndpoints::fail_peer(int peer, const std::string& reason) {
  std::lock_guard<std::mutex> lock(ucx_->mutex_);
  lose(peer_at(peer, "fail_peer"), reason);
}

engine::Request UcxEndpoints::isend(engine::Space space, const void* buf, size_t bytes, int peer,
                                    int t) {
  std::lock_guard<std::mutex> lock(ucx_->mutex_);
  Peer& p = peer_at(peer, "send");
  const uint64_t ucp_tag = tag(space, rank(), t);
  auto& e = ucx_->allocate(this, peer, bytes, true);
  if (p.lost != 0) {
    e.error = p.lost;
    return ucx_->posted(e, UCS_STATUS_PTR(UCS_ERR_CONNECTION_RESET));
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &UcxTransport::on_send;
  param.user_data = &e;
  return ucx_->posted(e, ucp_tag_send_nbx(p.ep, buf, bytes, ucp_tag, &param));
}

engine::Request UcxEndpoints::irecv(engine::Space space, void* buf, size_t bytes, int peer, int t) {
  std::lock_guard<std::mutex> lock(ucx_->mutex_);
  Peer* p = peer == kAnySource ? nullptr : &peer_at(peer, "receive");
  const uint64_t ucp_tag = tag(space, peer, t);
  auto& e = ucx_->allocate(this, peer, bytes, false);
  if (p != nullptr && p->lost != 0) {
    e.error = p->lost;
    return ucx_->posted(e, UCS_STATUS_PTR(UCS_ERR_CONNECTION_RESET));
  }
  ucp_request_param_t param{};
  // No immediate completion: UCX 1.13 leaves recv_info unset when a receive
  // completes inside the call; the callback always gets the sender and size.
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.recv = &UcxTransport::on_recv;
  param.user_data = &e;
  param.recv_info.tag_info = &e.info;
  return ucx_->posted(e, ucp_tag_recv_nbx(ucx_->worker_->get(), buf, bytes, ucp_tag,
                                          tag_layout::mask(peer), &param));
}

bool UcxEndpoints::improbe(engine::Space space, int peer, int t, engine::Message* message,
                           size_t* bytes) {
  std::lock_guard<std::mutex> lock(ucx_->mutex_);
  if (peer != kAnySource) peer_at(peer, "probe");
  // As MPI_Improbe, a probe drives progress: a message still arriving is found.
  ucx_->progress();
  ucp_tag_recv_info_t info{};
  ucp_tag_message_h m =
      ucp_tag_probe_nb(ucx_->worker_->get(), tag(space, peer, t), tag_layout::mask(peer), 1, &info);
  if (m == nullptr) return false;
  // The probed message waits in an entry that imrecv() turns into its request.
  auto& e = ucx_->allocate(this, tag_layout::source(info.sender_tag), info.length, false);
  e.state = UcxTransport::EntryState::kProbed;
  --ucx_->pending_;
  e.message = m;
  message->bits = reinterpret_cast<std::uintptr_t>(&e);
  *bytes = info.length;
  return true;
}

engine::Request UcxEndpoints::imrecv(void* buf, size_t bytes, engine::Message* message) {
  std::lock_guard<std::mutex> lock(ucx_->mutex_);
  RELAXCC_ENFORCE(message->bits != 0, InvalidArgument, "UCX imrecv: the message was not probed");
  auto& e = *reinterpret_cast<UcxTransport::Entry*>(message->bits);
  RELAXCC_ENFORCE(e.state == UcxTransport::EntryState::kProbed, InvalidArgument,
                  "UCX imrecv: the message was received already");
  RELAXCC_ENFORCE_GE(bytes, e.bytes, InvalidArgument,
                     "UCX imrecv: the buffer is shorter than the probed message from rank ",
                     e.peer);
  message->bits = 0;
  e.state = UcxTransport::EntryState::kPending;
  ++ucx_->pending_;
  ucp_request_param_t param{};
  // No immediate completion: UCX 1.13 leaves recv_info unset when a receive
  // completes inside the call; the callback always gets the sender and size.
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                       UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.recv = &UcxTransport::on_recv;
  param.user_data = &e;
  param.recv_info.tag_info = &e.info;
  const ucp_tag_message_h m = std::exchange(e.message, nullptr);
  engine::Request r =
      ucx_->posted(e, ucp_tag_msg_recv_nbx(ucx_->worker_->get(), buf, bytes, m, &param));
  // From a peer lost already: the data may never come.
  if (const int lost = peers_[static_cast<size_t>(e.peer)].lost; lost != 0)
    ucx_->fail_requests(this, e.peer, lost);
  return r;
}

PeerState UcxEndpoints::peer_state(int peer) const {
  std::lock_guard<std::mutex> lock(ucx_->mutex_);
  const Peer& p = peers_.at(static_cast<size_t>(peer));
  if (p.lost != 0) return PeerState::kLost;
  if (!p.same_host || peer == rank()) return PeerState::kAlive;
  const ProcessStatus s = process_status(p.process.pid);
  if (!s.runs(p.process)) return PeerState::kLost;
  return s.state == 'T' || s.state == 't' ? PeerState::kStopped : PeerState::kAlive;
}

bool UcxEndpoints::same_host(int peer) const {
  return peers_.at(static_cast<size_t>(peer)).same_host;
}

std::string UcxEndpoints::endpoint_info(int peer) const {
  std::lock_guard<std::mutex> lock(ucx_->mutex_);
  const Peer& p = peers_.at(static_cast<size_t>(peer));
  if (p.ep == nullptr) return "(no endpoint: the peer is lost)";
  char* text = nullptr;
  size_t length = 0;
  FILE* f = open_memstream(&text, &length);
  if (f == nullptr) return "(open_memstream failed)";
  ucp_ep_print_info(p.ep, f);
  std::fclose(f);
  std::string out(text, length);
  std::free(text);
  return out;
}

std::unique_ptr<engine::LivenessChannel> UcxEndpoints::liveness_channel() {
  if (liveness_.empty()) return nullptr;
  return std::make_unique<engine::UdpChannel>(options_.liveness, rank(), liveness_,
                                              liveness_token_);
}

UcxConnection connect(std::shared_ptr<Worker> worker, const std::vector<Blob>& blobs, int rank,
                      EndpointOptions options) {
  UcxConnection c;
  c.transport = std::make_shared<UcxTransport>(std::move(worker), rank);
  c.endpoints = std::make_shared<UcxEndpoints>(c.transport, blobs, rank, options);
  return c;
}

}  // namespace relaxcc::ucx
