#include "src/engine/edge_op.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "src/collectives/butterfly.h"

#include "relaxcc/errors.h"
#include "relaxcc/logging.h"

namespace relaxcc::engine {

EdgeOp::EdgeOp(std::string name, int priority, std::string label)
    : Operation(std::move(name), priority), label_(std::move(label)) {}

int EdgeOp::add_peer(int rank, int64_t msgs_from, int64_t msgs_to, int64_t elems_from,
                     int64_t elems_to) {
  Peer p;
  p.rank = rank;
  p.msgs_from = msgs_from;
  p.msgs_to = msgs_to;
  p.elems_from = elems_from;
  p.elems_to = elems_to;
  if (peers_.empty()) peers_.reserve(4);  // ring neighbours and butterfly partners, mostly
  peers_.push_back(std::move(p));
  return static_cast<int>(peers_.size()) - 1;
}

void EdgeOp::set_agreement(uint64_t value, const std::string& what) {
  header_.agree = value;
  if (value != 0 || !agree_what_.empty()) agree_what_ = value != 0 ? what : std::string();
}

void EdgeOp::reset_edges(const std::string& label) {
  label_ = label;
  for (Peer& p : peers_) {
    p.header_len = p.header_out_len = 0;
    p.inline_out = p.header_sent = p.inline_in = p.inline_ready = false;
    p.header_received = p.live = p.mismatch = false;
    p.posted_in = p.completed_in = p.posted_out = p.completed_out = 0;
    p.abort_recv_posted = p.abort_received = p.abort_sent = p.draining = false;
  }
  collecting_inline_ = false;
  deferred_.clear();
  exchanged_header_ = 0;
  exchanged_posted_ = 0;
  started_ = aborted_ = hard_abort_ = finished_ = false;
  abort_reason_.clear();
  abort_kind_ = AbortKind::error;
  abort_origin_ = -1;
  abort_lost_ = -1;
}

FirstContacts first_contacts(int rank, int size) {
  FirstContacts peers;
  if (size < 2) return peers;
  auto& r = peers.ranks;
  r[peers.count++] = (rank + size - 1) % size;
  r[peers.count++] = (rank + 1) % size;
  for (const ButterflyMove& m : butterfly_schedule(rank, size)) r[peers.count++] = m.peer;
  std::sort(r.begin(), r.begin() + peers.count);
  peers.count = static_cast<size_t>(std::unique(r.begin(), r.begin() + peers.count) - r.begin());
  return peers;
}

void EdgeOp::start(RequestPoster& t) {
  open_edges(t);
  // The peers' header messages are received after this rank's went out (its
  // send is what they wait for), whatever happens here.
  size_t deferred_posted = 0;
  try {
    // The first run() posts what is ready; small first messages go inline.
    collecting_inline_ = true;
    run(t);
    collecting_inline_ = false;
    for (int pi = 0; pi < static_cast<int>(peers_.size()); ++pi) {
      const Peer& p = peers_[pi];
      if (p.inline_out || !p.hold_header || p.msgs_to == 0 || aborted_) send_header(t, pi);
    }
    // Headers first: a large message posted before would queue ahead of them.
    for (; deferred_posted < deferred_.size(); ++deferred_posted) {
      const Deferred& d = deferred_[deferred_posted];
      t.isend(*this, slot(kDataSend, d.pi, d.msg), d.buf, d.bytes, peers_[d.pi].rank,
              tag(peers_[d.pi], Channel::data));
    }
    deferred_.clear();
  } catch (...) {
    // Data sends held back were counted as posted: those not posted never were.
    for (size_t k = deferred_posted; k < deferred_.size(); ++k)
      --peers_[deferred_[k].pi].posted_out;
    deferred_.clear();
    collecting_inline_ = false;
    receive_headers(t);
    throw;
  }
  receive_headers(t);
  check_finished(t);
}

bool EdgeOp::can_exchange(RequestPoster& t, int count) const {
  // Of two ranks, the peer is the only first contact.
  return t.size() == 2 && peers_.size() == 1 && peers_[0].msgs_to == count &&
         peers_[0].msgs_from == count && count >= 1 && 2 * count <= DirectExchange::kMaxRequests;
}

void EdgeOp::begin_exchange(RequestPoster& t, const Part* parts, int count, DirectExchange& x) {
  open_edges(t);
  Peer& p = peers_[0];
  put_inline(0, parts[0].data, parts[0].bytes);
  ++p.posted_out;  // as send_data counts a message that rides in the header
  x.peer = p.rank;
  // As in start(): the peer's header message is received whatever happens.
  const auto receive_header = [&] {
    exchange_header_request_ = x.count;
    x.add(t.post_irecv(p.header_buf.data(), p.header_len, p.rank, tag(p, Channel::header)),
          slot(kHeaderRecv, 0, 0), p.header_len, false);
  };
  try {
    x.add(t.post_isend(p.header_out, p.header_out_len, p.rank, tag(p, Channel::header)),
          slot(kHeaderSend, 0, 0), p.header_out_len, true);
    p.header_sent = true;
    for (int m = 1; m < count; ++m) {
      x.add(t.post_isend(parts[m].data, parts[m].bytes, p.rank, tag(p, Channel::data)),
            slot(kDataSend, 0, m), parts[m].bytes, true);
      ++p.posted_out;
    }
  } catch (...) {
    receive_header();
    throw;
  }
  receive_header();
}

unsigned char* EdgeOp::exchanged_data(const DirectExchange& x, size_t bytes) const {
  const Peer& p = peers_[0];
  if (x.received(exchange_header_request_) != sizeof(OpHeader) + bytes) return nullptr;
  OpHeader in;
  std::memcpy(&in, p.header_buf.data(), sizeof(OpHeader));
  if ((in.flags & kHeaderInlineData) == 0 || !same_call(edge_header(0), in)) return nullptr;
  return exchanged_first();
}

void EdgeOp::take_exchanged_header(DirectExchange& x) {
  x.requests[exchange_header_request_].consumed = true;
  exchanged_header_ = x.received(exchange_header_request_);
}

void EdgeOp::receive_exchanged(RequestPoster& t, int64_t msg, void* buf, size_t bytes,
                               DirectExchange& x) {
  const Peer& p = peers_[0];
  x.add(t.post_irecv(buf, bytes, p.rank, tag(p, Channel::data)), slot(kDataRecv, 0, msg), bytes,
        false);
  ++exchanged_posted_;
}

void EdgeOp::leave_exchange(RequestPoster& t) {
  if (exchanged_header_ == 0) return;
  // What on_complete does with a matching header message, then recv_data
  // and deliver_inline.
  Peer& p = peers_[0];
  take_header_message(p, exchanged_header_);
  p.live = true;
  p.posted_in = 1 + exchanged_posted_;
  p.completed_in = 1;
  post_abort_recv(t, 0);
}

void EdgeOp::start_failed(RequestPoster& t, std::exception_ptr error) {
  // Headers and abort records to every peer, data to none: they fail too.
  open_edges(t);
  fail(t, error, abort_cause(error).reason, AbortKind::error);
  receive_headers(t);
  check_finished(t);
}

void EdgeOp::open_edges(RequestPoster& t) {
  header_.seq = seq();
  header_.lane = t.lane_id();
  started_ = true;
  if (!contacts_added_) {  // kept when the operation is reused
    contacts_added_ = true;
    for (int rank : first_contacts(t.rank(), t.size())) {
      const bool known =
          std::any_of(peers_.begin(), peers_.end(), [&](const Peer& p) { return p.rank == rank; });
      if (!known) add_peer(rank, 0, 0);
    }
  }
  for (int pi = 0; pi < static_cast<int>(peers_.size()); ++pi) {
    Peer& p = peers_[pi];
    p.header_tag = t.collective_tag(header_.seq, Channel::header, p.rank);
    // No peer's header message exceeds this (same library, same constant).
    p.header_len = kHeaderMessageBytes;
    if (p.header_buf.size() == 0) {  // kept when the operation is reused
      p.header_buf = t.scratch(2 * kHeaderMessageBytes);
      p.header_out = p.header_buf.data() + kHeaderMessageBytes;
    }
  }
}

void EdgeOp::receive_headers(RequestPoster& t) {
  for (int pi = 0; pi < static_cast<int>(peers_.size()); ++pi)
    t.irecv(*this, slot(kHeaderRecv, pi, 0), peers_[pi].header_buf.data(), peers_[pi].header_len,
            peers_[pi].rank, tag(peers_[pi], Channel::header));
}

void EdgeOp::progress(RequestPoster& t) {
  if (finished_) return;
  if (aborted_) {
    if (!hard_abort_) drain(t);
  } else {
    run(t);
    deliver_inline(t);
  }
  check_finished(t);
}

void EdgeOp::deliver_inline(RequestPoster& t) {
  for (bool again = true; again && !aborted_;) {
    again = false;
    for (int pi = 0; pi < static_cast<int>(peers_.size()) && !aborted_; ++pi) {
      Peer& p = peers_[pi];
      if (!p.inline_ready) continue;
      p.inline_ready = false;
      ++p.completed_in;
      on_received(t, pi, 0);
      again = true;
    }
  }
}

void EdgeOp::send_data(RequestPoster& t, int pi, int64_t msg, const void* buf, size_t bytes) {
  Peer& p = peers_[pi];
  RELAXCC_ENFORCE(!p.mismatch && !aborted_, InternalError, name(), ": data send on a closed edge");
  RELAXCC_ENFORCE_EQ(msg, p.posted_out, InternalError, name(), ": data sends out of order");
  if (!p.header_sent && msg == 0 && bytes <= kInlineBytes) {
    // Copied behind the header; it completes with the header's send.
    put_inline(pi, buf, bytes);
    if (!collecting_inline_) send_header(t, pi);
  } else if (collecting_inline_) {
    deferred_.push_back({pi, msg, buf, bytes});  // posted right behind the headers
  } else {
    send_header(t, pi);  // a held header goes first
    t.isend(*this, slot(kDataSend, pi, msg), buf, bytes, p.rank, tag(p, Channel::data));
  }
  ++p.posted_out;
}

void EdgeOp::put_inline(int pi, const void* buf, size_t bytes) {
  Peer& p = peers_[pi];
  OpHeader h = edge_header(pi);
  h.flags |= kHeaderInlineData;
  p.header_out_len = sizeof(OpHeader) + bytes;
  std::memcpy(p.header_out, &h, sizeof(OpHeader));
  if (bytes > 0) std::memcpy(p.header_out + sizeof(OpHeader), buf, bytes);
  p.inline_out = true;
}

void EdgeOp::take_header_message(Peer& p, size_t got) {
  p.header_received = true;
  if (got >= sizeof(OpHeader))
    std::memcpy(&p.header_in, p.header_buf.data(), sizeof(OpHeader));
  else
    p.header_in.magic = 0;  // a corrupt header: describe() says so
  p.inline_in = (p.header_in.flags & kHeaderInlineData) != 0 && got >= sizeof(OpHeader);
  p.header_len = p.inline_in ? got : 0;
}

void EdgeOp::send_header(RequestPoster& t, int pi) {
  Peer& p = peers_[pi];
  if (p.header_sent) return;
  if (!p.inline_out) {
    p.header_out_len = sizeof(OpHeader);
    const OpHeader h = edge_header(pi);
    std::memcpy(p.header_out, &h, sizeof(OpHeader));
  }
  t.isend(*this, slot(kHeaderSend, pi, 0), p.header_out, p.header_out_len, p.rank,
          tag(p, Channel::header));
  p.header_sent = true;  // only once it is: a failed send is tried again by fail()
}

void EdgeOp::recv_data(RequestPoster& t, int pi, int64_t msg, void* buf, size_t bytes) {
  Peer& p = peers_[pi];
  RELAXCC_ENFORCE(p.live && !aborted_, InternalError, name(), ": data receive on a closed edge");
  RELAXCC_ENFORCE_EQ(msg, p.posted_in, InternalError, name(), ": data receives out of order");
  if (msg == 0 && p.inline_in) {
    const size_t got = p.header_len - sizeof(OpHeader);
    // Counted as posted only once it is taken (a failure here leaves it to
    // the drain).
    RELAXCC_ENFORCE_EQ(got, bytes, PeerMismatch, name(), " #", seq(), ": rank ", p.rank,
                       " sent an inline message of ", got, " bytes, rank ", t.rank(), " expects ",
                       bytes);
    ++p.posted_in;
    if (bytes > 0) std::memcpy(buf, p.header_buf.data() + sizeof(OpHeader), bytes);
    p.inline_ready = true;
    return;
  }
  // A matching peer sends an abort record only while it owes this rank data
  // (a mismatched one always does), so the record's receive is posted with
  // the first data receive that goes through the transport, or when this rank fails.
  post_abort_recv(t, pi);
  t.irecv(*this, slot(kDataRecv, pi, msg), buf, bytes, p.rank, tag(p, Channel::data));
  ++p.posted_in;  // only once it is: a receive that failed never completes
}

void EdgeOp::on_complete(RequestPoster& t, int64_t s, const Completion& completion) {
  const auto kind = static_cast<SlotKind>(s >> 56);
  const int pi = static_cast<int>((s >> 40) & 0xffff);
  const int64_t index = s & ((int64_t{1} << 40) - 1);
  Peer& p = peers_[pi];
  const bool cancelled = completion.cancelled;
  if (completion.error != 0 && !cancelled) {
    const std::string what = detail::concat(name(), " #", seq(), ": transport error with rank ",
                                            p.rank, ": ", t.error_string(completion.error));
    fail(t, std::make_exception_ptr(PeerLost(p.rank, what, __FILE__, __LINE__)), what,
         AbortKind::error, p.rank);
    if (kind == kDataRecv || kind == kDrainRecv) ++p.completed_in;
    if (kind == kDataSend || (kind == kHeaderSend && p.inline_out)) ++p.completed_out;
    check_finished(t);
    return;
  }
  switch (kind) {
    case kHeaderSend:
      if (p.inline_out) {
        ++p.completed_out;
        if (!aborted_) on_sent(t, pi, 0);
      }
      break;
    case kAbortSend:
      break;
    case kHeaderRecv: {
      if (cancelled) break;
      take_header_message(p, completion.bytes);
      if (same_call(edge_header(pi), p.header_in)) {
        p.live = true;
        if (!aborted_) {  // post its receives now, not an engine iteration later
          run(t);
          deliver_inline(t);
        }
      } else {
        // The peer may have posted data optimistically: it tells how much
        // (its inline message is already here).
        p.mismatch = true;
        if (p.inline_in) p.posted_in = p.completed_in = 1;
        post_abort_recv(t, pi);
        const std::string what = detail::concat(
            name(), detail::of_label(label_), ": ranks disagree: ",
            describe_mismatch(t.rank(), edge_header(pi), p.rank, p.header_in, agree_what_));
        fail(t, std::make_exception_ptr(PeerMismatch(what, __FILE__, __LINE__)), what,
             AbortKind::mismatch);
        send_abort(t, pi);
      }
      break;
    }
    case kAbortRecv: {
      if (cancelled) break;
      p.abort_received = true;
      p.abort_in.reason[sizeof(p.abort_in.reason) - 1] = '\0';
      const std::string what =
          detail::concat(name(), " #", seq(), detail::of_label(label_), ": rank ",
                         p.abort_in.origin, " failed: ", p.abort_in.reason);
      // A peer whose communicator was poisoned: its notice poisons this
      // rank's copy too, so the operation fails as the contract says; one
      // that lost a peer names it.
      const int lost =
          p.abort_in.lost >= 0 && p.abort_in.lost < t.size() && p.abort_in.lost != t.rank()
              ? p.abort_in.lost
              : -1;
      std::exception_ptr err;
      if (p.abort_in.kind == AbortKind::mismatch)
        err = std::make_exception_ptr(PeerMismatch(what, __FILE__, __LINE__));
      else if (lost >= 0)
        err = std::make_exception_ptr(PeerLost(lost, what, __FILE__, __LINE__));
      else if (p.abort_in.kind == AbortKind::poisoned)
        err = std::make_exception_ptr(CommunicatorPoisoned(what, __FILE__, __LINE__));
      else
        err = std::make_exception_ptr(CommunicationError(what, __FILE__, __LINE__));
      // Receives posted beyond what the peer sent will never match.
      // (Drain receives are matched to messages that exist.)
      for (int64_t m = p.limit_in(); m < p.posted_in; ++m)
        t.cancel_receives(*this, slot(kDataRecv, pi, m));
      abort_origin_ = p.abort_in.origin;
      fail(t, err, p.abort_in.reason, p.abort_in.kind, lost);
      break;
    }
    case kDataSend:
      ++p.completed_out;
      if (!aborted_) on_sent(t, pi, index);
      break;
    case kDataRecv:
      ++p.completed_in;
      if (!aborted_ && !cancelled) on_received(t, pi, index);
      break;
    case kDrainRecv:
      ++p.completed_in;
      p.draining = false;
      break;
  }
  check_finished(t);
}

void EdgeOp::abort(RequestPoster& t, std::exception_ptr error) {
  const AbortCause cause = abort_cause(error);
  const std::string& reason = cause.reason;
  if (cause.kind == AbortKind::poisoned && !hard_abort_) {
    hard_abort_ = true;
    set_error(error);
    // Tell peers owed data, cancel every receive, finish now.
    if (!aborted_) fail(t, error, reason, AbortKind::poisoned, cause.lost);
    for (int pi = 0; pi < static_cast<int>(peers_.size()); ++pi) {
      for (SlotKind k : {kHeaderRecv, kAbortRecv}) t.cancel_receives(*this, slot(k, pi, 0));
      // Drain receives are matched to messages that exist: they complete.
      for (int64_t m = peers_[pi].completed_in; m < peers_[pi].posted_in; ++m)
        t.cancel_receives(*this, slot(kDataRecv, pi, m));
    }
    finished_ = true;
    return;
  }
  fail(t, error, reason, AbortKind::error);
  check_finished(t);
}

void EdgeOp::fail(RequestPoster& t, std::exception_ptr error, const std::string& reason,
                  AbortKind kind, int lost) {
  set_error(std::move(error));
  if (aborted_) return;
  aborted_ = true;
  abort_reason_ = reason;
  abort_kind_ = kind;
  abort_lost_ = lost;
  if (abort_origin_ < 0) abort_origin_ = t.rank();
  if (!started_) {
    finished_ = true;
    return;
  }
  for (int pi = 0; pi < static_cast<int>(peers_.size()); ++pi) {
    const Peer& p = peers_[pi];
    // Every peer gets this rank's header (one held for inline data too); a
    // peer that got everything needs no abort record.
    send_header(t, pi);
    if (p.mismatch || p.posted_out < p.msgs_to) send_abort(t, pi);
    if (p.msgs_from > 0) post_abort_recv(t, pi);
  }
}

void EdgeOp::send_abort(RequestPoster& t, int pi) {
  Peer& p = peers_[pi];
  if (p.abort_sent) return;
  p.abort_sent = true;
  p.abort_out.kind = abort_kind_;
  p.abort_out.origin = abort_origin_;
  p.abort_out.lost = abort_lost_;
  p.abort_out.sent = p.posted_out;
  p.abort_out.set_reason(abort_reason_);
  t.isend(*this, slot(kAbortSend, pi, 0), &p.abort_out, sizeof(AbortRecord), p.rank,
          tag(p, Channel::abort));
}

void EdgeOp::post_abort_recv(RequestPoster& t, int pi) {
  Peer& p = peers_[pi];
  if (p.abort_recv_posted) return;
  t.irecv(*this, slot(kAbortRecv, pi, 0), &p.abort_in, sizeof(AbortRecord), p.rank,
          tag(p, Channel::abort));
  p.abort_recv_posted = true;
}

void EdgeOp::drain(RequestPoster& t) {
  // One message at a time per peer, sized by a matched probe: the buffer
  // only grows while no receive writes into it.
  for (int pi = 0; pi < static_cast<int>(peers_.size()); ++pi) {
    Peer& p = peers_[pi];
    if (p.live && p.inline_in && p.posted_in == 0 && p.limit_in() > 0)
      p.posted_in = p.completed_in = 1;
    if (p.inline_ready) {  // copied but not delivered: received all the same
      p.inline_ready = false;
      ++p.completed_in;
    }
    if (!(p.live || (p.mismatch && p.abort_received)) || p.draining || p.posted_in >= p.limit_in())
      continue;
    Message message;
    size_t bytes = 0;
    if (!t.improbe(p.rank, tag(p, Channel::data), &message, &bytes)) continue;
    if (p.drain.size() < bytes) p.drain.resize(bytes);
    p.draining = true;
    t.imrecv(*this, slot(kDrainRecv, pi, p.posted_in), p.drain.data(), bytes, &message, p.rank);
    ++p.posted_in;
  }
}

void EdgeOp::check_finished(RequestPoster& t) {
  if (finished_ || !started_) return;
  for (const Peer& p : peers_)
    if (!p.header_received) return;
  if (!aborted_) {
    if (!data_done()) return;
  } else {
    for (const Peer& p : peers_) {
      if (p.mismatch && !p.abort_received) return;
      if ((p.live || p.mismatch) && p.completed_in < p.limit_in()) return;
    }
  }
  // Data sends read caller buffers: the Work completes only after they did.
  for (const Peer& p : peers_)
    if (p.completed_out < p.posted_out) return;
  // Protocol complete: abort records can no longer come (nobody owes us data).
  for (int pi = 0; pi < static_cast<int>(peers_.size()); ++pi)
    if (peers_[pi].abort_recv_posted && !peers_[pi].abort_received)
      t.cancel_receives(*this, slot(kAbortRecv, pi, 0));
  finished_ = true;
}

OpHeader EdgeOp::edge_header(int pi) const {
  OpHeader h = header_;
  h.to_peer = peers_[pi].elems_to;
  h.from_peer = peers_[pi].elems_from;
  return h;
}

std::string EdgeOp::waiting_for() const {
  // Only the peers this rank still expects something from or sends to.
  std::ostringstream os;
  const char* sep = "";
  for (const Peer& p : peers_) {
    const bool header = !p.header_received;
    if (!header && p.completed_in >= p.limit_in() && p.completed_out >= p.msgs_to) continue;
    os << sep << "rank " << p.rank << " (";
    if (header)
      os << "header";
    else
      os << "data " << p.completed_in << "/" << p.limit_in() << " in, " << p.completed_out << "/"
         << p.msgs_to << " out";
    os << ")";
    sep = ", ";
  }
  return os.str();
}

}  // namespace relaxcc::engine
