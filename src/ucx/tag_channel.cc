#include "src/ucx/tag_channel.h"

#include <sys/epoll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "relaxcc/errors.h"

namespace relaxcc::ucx {

namespace {

using Clock = std::chrono::steady_clock;
// How often progress() looks at same-host peers' pidfds (an epoll_wait with
// no timeout), and how often it reads /proc where pidfds are unavailable.
constexpr auto kPidfdCheckPeriod = std::chrono::milliseconds(1);
constexpr auto kProcCheckPeriod = std::chrono::milliseconds(20);

std::exception_ptr peer_lost(int peer, const std::string& reason) {
  return std::make_exception_ptr(CommunicationError(
      detail::concat("UCX: peer rank ", peer, " lost: ", reason), __FILE__, __LINE__));
}

void add_to_epoll(int epoll_fd, int fd, uint64_t data) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = data;
  RELAXCC_ENFORCE(epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) == 0, CommunicationError,
                  "epoll_ctl(ADD) failed: ", std::strerror(errno));
}

}  // namespace

TagChannel::TagChannel(std::shared_ptr<Worker> worker, const std::vector<Blob>& blobs, int rank,
                       ChannelOptions options)
    : worker_(std::move(worker)), rank_(rank), options_(options) {
  RELAXCC_ENFORCE(worker_ != nullptr, InvalidArgument, "ucx::TagChannel needs a worker");
  RELAXCC_ENFORCE(!blobs.empty() && blobs.size() <= static_cast<size_t>(tag_layout::kMaxRanks),
                  InvalidArgument, "ucx::TagChannel: ", blobs.size(),
                  " ranks; the tag layout holds 1 to ", tag_layout::kMaxRanks);
  RELAXCC_ENFORCE(rank >= 0 && static_cast<size_t>(rank) < blobs.size(), InvalidArgument,
                  "ucx::TagChannel: rank ", rank, " of ", blobs.size());
  RELAXCC_ENFORCE_LE(options_.generation, tag_layout::kMaxGeneration, InvalidArgument,
                     "ucx::TagChannel: generation");
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  liveness_fd_ = epoll_create1(EPOLL_CLOEXEC);
  try {
    RELAXCC_ENFORCE(epoll_fd_ >= 0 && liveness_fd_ >= 0, CommunicationError,
                    "epoll_create1 failed: ", std::strerror(errno));
    add_to_epoll(epoll_fd_, worker_->event_fd(), 0);
    add_to_epoll(epoll_fd_, liveness_fd_, 1);
    connect(blobs);
  } catch (...) {
    close_endpoints();
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
    if (liveness_fd_ >= 0) ::close(liveness_fd_);
    throw;
  }
}

void TagChannel::connect(const std::vector<Blob>& blobs) {
  const PeerBlob self = PeerBlob::decode(blobs[static_cast<size_t>(rank_)], rank_);
  RELAXCC_ENFORCE(self.process == ProcessIdentity::of_this_process(), InvalidArgument,
                  "ucx::TagChannel: blob ", rank_, " is not this process's (rank ", rank_, ")");
  peers_.resize(blobs.size());
  for (size_t r = 0; r < blobs.size(); ++r) {
    Peer& p = peers_[r];
    p.owner = this;
    p.rank = static_cast<int>(r);
    const PeerBlob b = PeerBlob::decode(blobs[r], p.rank);
    p.same_host = b.host == self.host && (options_.share_memory || p.rank == rank_);
    p.process = b.process;
    if (p.same_host && p.rank != rank_) {
      p.pidfd = static_cast<int>(syscall(SYS_pidfd_open, p.process.pid, 0));
      if (p.pidfd < 0 && errno != ENOSYS && errno != EPERM)
        RELAXCC_THROW(CommunicationError, "UCX: peer rank ", p.rank, " (pid ", p.process.pid,
                      ") is gone: pidfd_open: ", std::strerror(errno));
      // The pidfd names the process only if it is still the one that
      // published the blob (pids are reused).
      if (!process_status(p.process.pid).runs(p.process))
        RELAXCC_THROW(CommunicationError, "UCX: peer rank ", p.rank, " (pid ", p.process.pid,
                      ") is gone before its endpoint was created");
      if (p.pidfd >= 0)
        add_to_epoll(liveness_fd_, p.pidfd, static_cast<uint64_t>(r));
      else
        liveness_polled_ = true;
    }
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.address = reinterpret_cast<const ucp_address_t*>(b.worker_address.data());
    if (p.same_host) {
      params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    } else {
      params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
      params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      params.err_handler.cb = &TagChannel::on_endpoint_error;
      params.err_handler.arg = &p;
    }
    const ucs_status_t status = ucp_ep_create(worker_->get(), &params, &p.ep);
    if (status != UCS_OK)
      RELAXCC_THROW(CommunicationError, "UCX: ucp_ep_create to rank ", p.rank,
                    " failed: ", ucs_status_string(status));
  }
}

TagChannel::~TagChannel() {
  // Receives are cancelled; unfinished sends go on inside UCX until their
  // endpoint is closed. No callback reaches a freed request.
  for (Entry& e : entries_) {
    if (e.request == nullptr) continue;
    if (e.state == EntryState::kPending && !e.send) ucp_request_cancel(worker_->get(), e.request);
    ucp_request_free(e.request);
    e.request = nullptr;
  }
  close_endpoints();
  ::close(epoll_fd_);
  ::close(liveness_fd_);
}

void TagChannel::close_endpoints() {
  for (Peer& p : peers_) {
    if (p.ep == nullptr) continue;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = p.lost ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    const ucs_status_ptr_t r = ucp_ep_close_nbx(p.ep, &param);
    if (UCS_PTR_IS_PTR(r)) closing_.push_back(r);
    p.ep = nullptr;
    if (p.pidfd >= 0) ::close(p.pidfd);
    p.pidfd = -1;
  }
  const auto deadline = Clock::now() + options_.close_timeout;
  while (!closing_.empty()) {
    worker_->progress();
    for (size_t i = 0; i < closing_.size();) {
      if (ucp_request_check_status(closing_[i]) != UCS_INPROGRESS) {
        ucp_request_free(closing_[i]);
        closing_[i] = closing_.back();
        closing_.pop_back();
      } else {
        ++i;
      }
    }
    if (Clock::now() > deadline) {
      // Peers that never answer: the worker's destruction releases them.
      for (void* r : closing_) ucp_request_free(r);
      closing_.clear();
    }
  }
}

TagChannel::Peer& TagChannel::peer_at(int peer, const char* what) {
  RELAXCC_ENFORCE(peer >= 0 && peer < size(), InvalidArgument, "UCX ", what, ": rank ", peer,
                  " is not one of 0..", size() - 1);
  return peers_[static_cast<size_t>(peer)];
}

TagChannel::Entry& TagChannel::allocate(int64_t slot, int peer, size_t bytes, bool send) {
  int id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = static_cast<int>(entries_.size());
    entries_.emplace_back();
  }
  Entry& e = entries_[static_cast<size_t>(id)];
  e = Entry{};
  e.owner = this;
  e.id = id;
  e.state = EntryState::kPending;
  e.send = send;
  e.slot = slot;
  e.peer = peer;
  e.bytes = bytes;
  ++pending_;
  return e;
}

void TagChannel::make_ready(Entry& e) {
  e.state = EntryState::kReady;
  ready_.push_back(e.id);
}

void TagChannel::on_send(void*, ucs_status_t status, void* user_data) {
  auto& e = *static_cast<Entry*>(user_data);
  if (e.state != EntryState::kPending) return;
  e.status = status;
  e.owner->make_ready(e);
}

void TagChannel::on_recv(void*, ucs_status_t status, const ucp_tag_recv_info_t* info,
                         void* user_data) {
  auto& e = *static_cast<Entry*>(user_data);
  if (e.state != EntryState::kPending) return;
  e.status = status;
  if (status == UCS_OK && info != nullptr) e.info = *info;
  e.owner->make_ready(e);
}

void TagChannel::on_endpoint_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto& p = *static_cast<Peer*>(arg);
  // Inside ucp's progress: fail_peer() closes the endpoint, so it runs after.
  p.owner->endpoint_errors_.emplace_back(p.rank, ucs_status_string(status));
}

int TagChannel::posted(Entry& e, ucs_status_ptr_t result) {
  if (result == nullptr) {
    e.status = UCS_OK;
    make_ready(e);
  } else if (UCS_PTR_IS_ERR(result)) {
    e.status = UCS_PTR_STATUS(result);
    make_ready(e);
  } else {
    e.request = result;
  }
  return e.id;
}

int TagChannel::isend(int64_t slot, const void* buf, size_t bytes, int peer, uint32_t tag,
                      TagSpace space) {
  Peer& p = peer_at(peer, "send");
  Entry& e = allocate(slot, peer, bytes, true);
  if (p.lost) {
    e.error = p.error;
    make_ready(e);
    return e.id;
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &TagChannel::on_send;
  param.user_data = &e;
  return posted(e,
                ucp_tag_send_nbx(p.ep, buf, bytes,
                                 tag_layout::make(space, options_.generation, rank_, tag), &param));
}

int TagChannel::irecv(int64_t slot, void* buf, size_t bytes, int peer, uint32_t tag,
                      TagSpace space) {
  Entry& e = allocate(slot, peer, bytes, false);
  if (peer != kAnySource) {
    Peer& p = peer_at(peer, "receive");
    if (p.lost) {
      e.error = p.error;
      make_ready(e);
      return e.id;
    }
  }
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_RECV_INFO;
  param.cb.recv = &TagChannel::on_recv;
  param.user_data = &e;
  param.recv_info.tag_info = &e.info;
  return posted(e, ucp_tag_recv_nbx(worker_->get(), buf, bytes,
                                    tag_layout::make(space, options_.generation, peer, tag),
                                    tag_layout::mask(peer), &param));
}

bool TagChannel::improbe(int peer, uint32_t tag, TagSpace space, ProbedMessage* message) {
  if (peer != kAnySource) peer_at(peer, "probe");
  ucp_tag_recv_info_t info{};
  ucp_tag_message_h m =
      ucp_tag_probe_nb(worker_->get(), tag_layout::make(space, options_.generation, peer, tag),
                       tag_layout::mask(peer), 1, &info);
  if (m == nullptr) return false;
  message->handle = m;
  message->source = tag_layout::source(info.sender_tag);
  message->tag = tag_layout::user_tag(info.sender_tag);
  message->bytes = info.length;
  return true;
}

int TagChannel::imrecv(int64_t slot, void* buf, size_t bytes, const ProbedMessage& message) {
  RELAXCC_ENFORCE(message.handle != nullptr, InvalidArgument,
                  "UCX imrecv: the message was not probed");
  RELAXCC_ENFORCE_GE(bytes, message.bytes, InvalidArgument,
                     "UCX imrecv: the buffer is shorter than the probed message from rank ",
                     message.source);
  Entry& e = allocate(slot, message.source, bytes, false);
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_RECV_INFO;
  param.cb.recv = &TagChannel::on_recv;
  param.user_data = &e;
  param.recv_info.tag_info = &e.info;
  return posted(e, ucp_tag_msg_recv_nbx(worker_->get(), buf, bytes, message.handle, &param));
}

void TagChannel::cancel(int request) {
  RELAXCC_ENFORCE(request >= 0 && static_cast<size_t>(request) < entries_.size(), InvalidArgument,
                  "UCX cancel: no request ", request);
  Entry& e = entries_[static_cast<size_t>(request)];
  RELAXCC_ENFORCE(!e.send, InvalidArgument, "UCX cancel: request ", request,
                  " is a send; only receives are cancelled");
  if (e.state == EntryState::kPending && e.request != nullptr)
    ucp_request_cancel(worker_->get(), e.request);
}

void TagChannel::fail_peer(int peer, const std::string& reason) {
  Peer& p = peer_at(peer, "fail_peer");
  if (p.lost || peer == rank_) return;
  p.lost = true;
  p.error = peer_lost(peer, reason);
  // Requests first, so that no callback reports them cancelled: receives
  // are cancelled, sends are released to the endpoint's forced close.
  for (Entry& e : entries_) {
    if (e.state != EntryState::kPending || e.peer != peer) continue;
    e.error = p.error;
    make_ready(e);
    if (e.request != nullptr) {
      if (!e.send) ucp_request_cancel(worker_->get(), e.request);
      ucp_request_free(e.request);
      e.request = nullptr;
    }
  }
  if (p.ep != nullptr) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    const ucs_status_ptr_t r = ucp_ep_close_nbx(p.ep, &param);
    if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
    p.ep = nullptr;
  }
  if (p.pidfd >= 0) {
    epoll_ctl(liveness_fd_, EPOLL_CTL_DEL, p.pidfd, nullptr);
    ::close(p.pidfd);
    p.pidfd = -1;
  }
  lost_.push_back(LostPeer{peer, reason});
}

std::vector<LostPeer> TagChannel::take_lost_peers() {
  return std::exchange(lost_, {});
}

PeerState TagChannel::peer_state(int peer) const {
  const Peer& p = peers_.at(static_cast<size_t>(peer));
  if (p.lost) return PeerState::kLost;
  if (!p.same_host || peer == rank_) return PeerState::kAlive;
  const ProcessStatus s = process_status(p.process.pid);
  if (!s.runs(p.process)) return PeerState::kLost;
  return s.state == 'T' || s.state == 't' ? PeerState::kStopped : PeerState::kAlive;
}

std::string TagChannel::endpoint_info(int peer) const {
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

void TagChannel::check_liveness(bool now) {
  const auto t = Clock::now();
  if (!now && t < next_liveness_check_) return;
  next_liveness_check_ = t + (liveness_polled_ ? kProcCheckPeriod : kPidfdCheckPeriod);
  epoll_event events[16];
  const int n = epoll_wait(liveness_fd_, events, 16, 0);
  for (int i = 0; i < n; ++i) {
    const int peer = static_cast<int>(events[i].data.u64);
    fail_peer(peer,
              detail::concat("its process (pid ", peers_[static_cast<size_t>(peer)].process.pid,
                             ", same host) ended"));
  }
  if (!liveness_polled_) return;
  for (Peer& p : peers_)
    if (p.same_host && p.rank != rank_ && !p.lost && p.pidfd < 0 &&
        !process_status(p.process.pid).runs(p.process))
      fail_peer(p.rank, detail::concat("its process (pid ", p.process.pid, ", same host) ended"));
}

void TagChannel::progress() {
  while (worker_->progress() != 0) {
  }
  for (size_t i = 0; i < endpoint_errors_.size(); ++i) {
    const auto [peer, reason] = endpoint_errors_[i];
    fail_peer(peer, "its endpoint failed: " + reason);
  }
  endpoint_errors_.clear();
  check_liveness(false);
}

Completion TagChannel::complete(Entry& e) {
  Completion c;
  c.request = e.id;
  c.slot = e.slot;
  c.peer = e.peer;
  c.send = e.send;
  c.bytes = e.send ? e.bytes : 0;
  if (e.error) {
    c.error = e.error;
  } else if (e.status == UCS_OK) {
    if (!e.send) {
      c.bytes = e.info.length;
      c.peer = tag_layout::source(e.info.sender_tag);
    }
  } else if (e.status == UCS_ERR_CANCELED && !e.send) {
    c.cancelled = true;
  } else if (e.status == UCS_ERR_MESSAGE_TRUNCATED) {
    c.error = std::make_exception_ptr(CommunicationError(
        detail::concat("UCX: a message from ", e.peer == kAnySource ? "any rank" : "rank ",
                       e.peer == kAnySource ? std::string() : std::to_string(e.peer),
                       " is longer than the receive's ", e.bytes, " bytes"),
        __FILE__, __LINE__));
  } else if (e.peer != kAnySource) {
    // A transport failure on the way to or from one peer: that peer is lost.
    fail_peer(e.peer, detail::concat(e.send ? "a send" : "a receive",
                                     " failed: ", ucs_status_string(e.status)));
    c.error = peers_[static_cast<size_t>(e.peer)].error;
    if (!c.error) c.error = peer_lost(e.peer, ucs_status_string(e.status));
  } else {
    c.error = std::make_exception_ptr(CommunicationError(
        detail::concat("UCX: a receive from any rank failed: ", ucs_status_string(e.status)),
        __FILE__, __LINE__));
  }
  if (e.request != nullptr) ucp_request_free(e.request);
  e.request = nullptr;
  e.state = EntryState::kFree;
  free_.push_back(e.id);
  --pending_;
  return c;
}

size_t TagChannel::testsome(std::vector<Completion>& out) {
  progress();
  const size_t before = out.size();
  // complete() may fail a peer, which readies more requests.
  for (size_t i = 0; i < ready_.size(); ++i)
    out.push_back(complete(entries_[static_cast<size_t>(ready_[i])]));
  ready_.clear();
  return out.size() - before;
}

bool TagChannel::arm() {
  if (!ready_.empty() || !endpoint_errors_.empty()) return false;
  if (!worker_->arm()) return false;
  check_liveness(true);
  return ready_.empty();
}

bool TagChannel::wait(std::chrono::milliseconds timeout) {
  progress();
  if (!ready_.empty()) return true;
  if (!arm()) return true;
  epoll_event ev{};
  int n;
  do {
    n = epoll_wait(epoll_fd_, &ev, 1, static_cast<int>(timeout.count()));
  } while (n < 0 && errno == EINTR);
  if (n > 0) progress();
  return n > 0 || !ready_.empty();
}

}  // namespace relaxcc::ucx
