#include "edge_op.h"

#include <algorithm>
#include <sstream>

#include "butterfly.h"

#include "relaxcc/errors.h"
#include "relaxcc/logging.h"

namespace relaxcc::mpi {

EdgeOp::EdgeOp(std::string name, int priority, std::string label)
    : Operation(std::move(name), priority), label_(std::move(label)) {}

int EdgeOp::add_peer(int rank, int64_t msgs_from, int64_t msgs_to) {
  Peer p;
  p.rank = rank;
  p.msgs_from = msgs_from;
  p.msgs_to = msgs_to;
  peers_.push_back(std::move(p));
  return static_cast<int>(peers_.size()) - 1;
}

std::vector<int> first_contacts(int rank, int size) {
  std::vector<int> peers;
  if (size < 2) return peers;
  peers.push_back((rank + size - 1) % size);
  peers.push_back((rank + 1) % size);
  for (const ButterflyMove& m : butterfly_schedule(rank, size)) peers.push_back(m.peer);
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  return peers;
}

void EdgeOp::start(Transport& t) {
  header_.seq = seq();
  started_ = true;
  for (int rank : first_contacts(t.rank(), t.size())) {
    const bool known = std::any_of(peers_.begin(), peers_.end(), [&](const Peer& p) { return p.rank == rank; });
    if (!known) add_peer(rank, 0, 0);
  }
  for (int pi = 0; pi < static_cast<int>(peers_.size()); ++pi) {
    Peer& p = peers_[pi];
    t.isend(*this, slot(kHeaderSend, pi, 0), &header_, sizeof(OpHeader), p.rank, tag(Channel::header, t));
    t.irecv(*this, slot(kHeaderRecv, pi, 0), &p.header_in, sizeof(OpHeader), p.rank, tag(Channel::header, t));
    // A matching peer sends an abort record only while it owes this rank
    // data; a mismatched one always does (posted then).
    if (p.msgs_from > 0) post_abort_recv(t, pi);
  }
  run(t);  // the first data goes out right behind the headers
  check_finished(t);
}

void EdgeOp::progress(Transport& t) {
  if (finished_) return;
  if (aborted_) {
    if (!hard_abort_) drain(t);
  } else {
    run(t);
  }
  check_finished(t);
}

void EdgeOp::send_data(Transport& t, int pi, int64_t msg, const void* buf, size_t bytes) {
  Peer& p = peers_[pi];
  RELAXCC_ENFORCE(!p.mismatch && !aborted_, InternalError, name(), ": data send on a closed edge");
  RELAXCC_ENFORCE_EQ(msg, p.posted_out, InternalError, name(), ": data sends out of order");
  t.isend(*this, slot(kDataSend, pi, msg), buf, bytes, p.rank, tag(Channel::data, t));
  ++p.posted_out;
}

void EdgeOp::recv_data(Transport& t, int pi, int64_t msg, void* buf, size_t bytes) {
  Peer& p = peers_[pi];
  RELAXCC_ENFORCE(p.live && !aborted_, InternalError, name(), ": data receive on a closed edge");
  RELAXCC_ENFORCE_EQ(msg, p.posted_in, InternalError, name(), ": data receives out of order");
  t.irecv(*this, slot(kDataRecv, pi, msg), buf, bytes, p.rank, tag(Channel::data, t));
  ++p.posted_in;
}

void EdgeOp::on_complete(Transport& t, int64_t s, const MPI_Status& status, int error) {
  const auto kind = static_cast<SlotKind>(s >> 56);
  const int pi = static_cast<int>((s >> 40) & 0xffff);
  const int64_t index = s & ((int64_t{1} << 40) - 1);
  Peer& p = peers_[pi];
  int cancelled = 0;
  MPI_Test_cancelled(&status, &cancelled);
  if (error != MPI_SUCCESS && !cancelled) {
    const std::string what = detail::concat(name(), " #", seq(), ": transport error with rank ",
                                            p.rank, ": ", mpi_error_string(error));
    fail(t, std::make_exception_ptr(CommunicationError(what, __FILE__, __LINE__)), what, AbortKind::error);
    if (kind == kDataRecv || kind == kDrainRecv) ++p.completed_in;
    check_finished(t);
    return;
  }
  switch (kind) {
    case kHeaderSend:
    case kAbortSend:
      break;
    case kHeaderRecv: {
      if (cancelled) break;
      p.header_received = true;
      if (same_call(header_, p.header_in)) {
        p.live = true;
        if (!aborted_) run(t);  // post its receives now, not an engine iteration later
      } else {
        // The peer may have posted data optimistically: it tells how much.
        p.mismatch = true;
        post_abort_recv(t, pi);
        const std::string what = detail::concat(
            name(), label_.empty() ? "" : " of '" + label_ + "'", ": ranks disagree: rank ", t.rank(),
            " calls ", describe(header_), ", rank ", p.rank, " calls ", describe(p.header_in));
        fail(t, std::make_exception_ptr(PeerMismatch(what, __FILE__, __LINE__)), what, AbortKind::mismatch);
        send_abort(t, pi);
      }
      break;
    }
    case kAbortRecv: {
      if (cancelled) break;
      p.abort_received = true;
      p.abort_in.reason[sizeof(p.abort_in.reason) - 1] = '\0';
      const std::string what = detail::concat(name(), " #", seq(), label_.empty() ? "" : " of '" + label_ + "'",
                                              ": rank ", p.abort_in.origin, " failed: ", p.abort_in.reason);
      auto err = p.abort_in.kind == AbortKind::mismatch
                     ? std::make_exception_ptr(PeerMismatch(what, __FILE__, __LINE__))
                     : std::make_exception_ptr(CommunicationError(what, __FILE__, __LINE__));
      // Receives posted beyond what the peer sent will never match.
      for (int64_t m = p.limit_in(); m < p.posted_in; ++m) {
        t.cancel_receives(*this, slot(kDataRecv, pi, m));
        t.cancel_receives(*this, slot(kDrainRecv, pi, m));
      }
      abort_origin_ = p.abort_in.origin;
      fail(t, err, p.abort_in.reason, p.abort_in.kind);
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

void EdgeOp::abort(Transport& t, std::exception_ptr error) {
  const AbortCause cause = abort_cause(error);
  const std::string& reason = cause.reason;
  if (cause.kind == AbortKind::poisoned && !hard_abort_) {
    hard_abort_ = true;
    set_error(error);
    // Tell peers owed data, cancel every receive, finish now.
    if (!aborted_) fail(t, error, reason, AbortKind::poisoned);
    for (int pi = 0; pi < static_cast<int>(peers_.size()); ++pi) {
      for (SlotKind k : {kHeaderRecv, kAbortRecv}) t.cancel_receives(*this, slot(k, pi, 0));
      for (int64_t m = peers_[pi].completed_in; m < peers_[pi].posted_in; ++m) {
        t.cancel_receives(*this, slot(kDataRecv, pi, m));
        t.cancel_receives(*this, slot(kDrainRecv, pi, m));
      }
    }
    finished_ = true;
    return;
  }
  fail(t, error, reason, AbortKind::error);
  check_finished(t);
}

void EdgeOp::fail(Transport& t, std::exception_ptr error, const std::string& reason, AbortKind kind) {
  set_error(std::move(error));
  if (aborted_) return;
  aborted_ = true;
  abort_reason_ = reason;
  abort_kind_ = kind;
  if (abort_origin_ < 0) abort_origin_ = t.rank();
  if (!started_) {
    finished_ = true;
    return;
  }
  for (int pi = 0; pi < static_cast<int>(peers_.size()); ++pi) {
    const Peer& p = peers_[pi];
    // A peer that got everything needs nothing.
    if (p.mismatch || p.posted_out < p.msgs_to) send_abort(t, pi);
  }
}

void EdgeOp::send_abort(Transport& t, int pi) {
  Peer& p = peers_[pi];
  if (p.abort_sent) return;
  p.abort_sent = true;
  p.abort_out.kind = abort_kind_;
  p.abort_out.origin = abort_origin_;
  p.abort_out.sent = p.posted_out;
  p.abort_out.set_reason(abort_reason_);
  t.isend(*this, slot(kAbortSend, pi, 0), &p.abort_out, sizeof(AbortRecord), p.rank, tag(Channel::abort, t));
}

void EdgeOp::post_abort_recv(Transport& t, int pi) {
  Peer& p = peers_[pi];
  if (p.abort_recv_posted) return;
  p.abort_recv_posted = true;
  t.irecv(*this, slot(kAbortRecv, pi, 0), &p.abort_in, sizeof(AbortRecord), p.rank, tag(Channel::abort, t));
}

void EdgeOp::drain(Transport& t) {
  // One message at a time per peer, sized by a matched probe: the buffer
  // only grows while no receive writes into it.
  for (int pi = 0; pi < static_cast<int>(peers_.size()); ++pi) {
    Peer& p = peers_[pi];
    if (!(p.live || (p.mismatch && p.abort_received)) || p.draining || p.posted_in >= p.limit_in()) continue;
    MPI_Message message;
    size_t bytes = 0;
    if (!t.improbe(p.rank, tag(Channel::data, t), &message, &bytes)) continue;
    if (p.drain.size() < bytes) p.drain.resize(bytes);
    p.draining = true;
    t.imrecv(*this, slot(kDrainRecv, pi, p.posted_in), p.drain.data(), bytes, &message, p.rank);
    ++p.posted_in;
  }
}

void EdgeOp::check_finished(Transport& t) {
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

std::string EdgeOp::waiting_for() const {
  std::ostringstream os;
  for (const Peer& p : peers_) {
    os << "rank " << p.rank << " (";
    if (!p.header_received) os << "header";
    else os << "data " << p.completed_in << "/" << p.limit_in() << " in, " << p.posted_out << "/"
            << p.msgs_to << " out";
    os << ") ";
  }
  return os.str();
}

}  // namespace relaxcc::mpi
