#include "recursive_doubling.h"

#include <cstring>
#include <sstream>

#include "relaxcc/errors.h"
#include "relaxcc/kernels/reduce.h"

namespace relaxcc::mpi {

RecursiveDoublingOp::RecursiveDoublingOp(std::string name, int priority, std::string label,
                                         const TensorView& data, ReduceOp op, int rank, int size,
                                         const ExecContext& ctx, int algo_id)
    : Operation(std::move(name), priority),
      label_(std::move(label)),
      data_(data),
      op_(op),
      rank_(rank),
      size_(size),
      ctx_(ctx) {
  header_.type = OpType::allreduce;
  header_.dtype = data.dtype;
  header_.op = op;
  header_.algo = static_cast<uint8_t>(algo_id);
  header_.count = data.numel;
  int p = 1;
  while (p * 2 <= size_) p *= 2;
  const int rem = size_ - p;
  int newrank = -1;
  if (rank_ < 2 * rem) {
    if (rank_ % 2 == 0) {
      steps_.push_back({StepKind::fold_in_send, rank_ + 1, true, false});
      steps_.push_back({StepKind::fold_out_recv, rank_ + 1, false, true});
      return;
    }
    steps_.push_back({StepKind::fold_in, rank_ - 1, false, true});
    newrank = rank_ / 2;
  } else {
    newrank = rank_ - rem;
  }
  for (int mask = 1; mask < p; mask <<= 1) {
    const int partner_new = newrank ^ mask;
    const int partner = partner_new < rem ? partner_new * 2 + 1 : partner_new + rem;
    steps_.push_back({StepKind::round, partner, true, true});
  }
  if (rank_ < 2 * rem) steps_.push_back({StepKind::fold_out_send, rank_ - 1, true, false});
}

void RecursiveDoublingOp::start(Transport& t) {
  header_.seq = seq();
  send_buf_.resize(message_bytes());
  recv_buf_.resize(message_bytes());
  if (steps_.empty()) {
    if (op_ == ReduceOp::avg) kernels::finish_average(data_, size_, ctx_);
    done_ = true;
    return;
  }
  post_step(t);
}

void RecursiveDoublingOp::progress(Transport& t) {
  if (!probing_ || done_) return;
  const Step& s = steps_[step_];
  MPI_Message message;
  size_t bytes = 0;
  if (!t.improbe(s.peer, collective_tag(header_.seq, Channel::data, t.max_tag()), &message, &bytes)) return;
  probing_ = false;
  received_bytes_ = bytes;
  if (recv_buf_.size() < bytes) recv_buf_.resize(bytes);
  t.imrecv(*this, 1, recv_buf_.data(), bytes, &message, s.peer);
}

void RecursiveDoublingOp::post_step(Transport& t) {
  // The last round leaves the final result: divide once, before handing it on.
  const Step& s = steps_[step_];
  if (s.kind == StepKind::fold_out_send && !failed_ && op_ == ReduceOp::avg)
    kernels::finish_average(data_, size_, ctx_);
  const int tag = collective_tag(header_.seq, Channel::data, t.max_tag());
  outstanding_ = 0;
  recv_ok_ = false;
  if (s.recv) {
    probing_ = true;  // progress() receives the message once it is there
    ++outstanding_;
  }
  if (s.send) {
    Prefix prefix;
    prefix.header = header_;
    prefix.aborted = failed_ ? 1 : 0;
    prefix.abort = failure_;
    std::memcpy(send_buf_.data(), &prefix, sizeof(Prefix));
    size_t bytes = sizeof(Prefix);
    if (!failed_ && data_.numel > 0) {
      std::memcpy(send_buf_.data() + sizeof(Prefix), data_.data, data_.nbytes());
      bytes += data_.nbytes();
    }
    t.isend(*this, 2, send_buf_.data(), bytes, s.peer, tag);
    ++outstanding_;
  }
  posted_ = true;
}

void RecursiveDoublingOp::record_failure(std::exception_ptr error, const std::string& reason,
                                         AbortKind kind, int origin) {
  set_error(std::move(error));
  if (failed_) return;
  failed_ = true;
  failure_.kind = kind;
  failure_.origin = origin;
  failure_.set_reason(reason);
}

void RecursiveDoublingOp::on_complete(Transport& t, int64_t slot, const MPI_Status& status, int error) {
  int cancelled = 0;
  MPI_Test_cancelled(&status, &cancelled);
  const Step& s = steps_[step_];
  if (slot == 1 && !cancelled) {
    const std::string where = detail::concat("allreduce #", header_.seq,
                                             label_.empty() ? "" : " of '" + label_ + "'");
    const size_t got = received_bytes_;
    if (error != MPI_SUCCESS) {
      const std::string what = detail::concat(where, ": transport error with rank ", s.peer, ": ",
                                              mpi_error_string(error));
      record_failure(std::make_exception_ptr(CommunicationError(what, __FILE__, __LINE__)), what,
                     AbortKind::error, rank_);
    } else if (got < sizeof(Prefix)) {
      const std::string what = detail::concat(where, ": short message from rank ", s.peer);
      record_failure(std::make_exception_ptr(PeerMismatch(what, __FILE__, __LINE__)), what,
                     AbortKind::mismatch, rank_);
    } else {
      Prefix prefix;
      std::memcpy(&prefix, recv_buf_.data(), sizeof(Prefix));
      prefix.abort.reason[sizeof(prefix.abort.reason) - 1] = '\0';
      if (prefix.aborted) {
        const std::string what = detail::concat(where, ": rank ", prefix.abort.origin, " failed: ",
                                                prefix.abort.reason);
        auto err = prefix.abort.kind == AbortKind::mismatch
                       ? std::make_exception_ptr(PeerMismatch(what, __FILE__, __LINE__))
                       : std::make_exception_ptr(CommunicationError(what, __FILE__, __LINE__));
        record_failure(err, prefix.abort.reason, prefix.abort.kind, prefix.abort.origin);
      } else if (!same_call(header_, prefix.header) || got != message_bytes()) {
        const std::string what = detail::concat(where, ": ranks disagree: rank ", rank_, " calls ",
                                                describe(header_), ", rank ", s.peer, " calls ",
                                                describe(prefix.header));
        record_failure(std::make_exception_ptr(PeerMismatch(what, __FILE__, __LINE__)), what,
                       AbortKind::mismatch, rank_);
      } else {
        recv_ok_ = true;
      }
    }
  } else if (slot == 2 && error != MPI_SUCCESS) {
    const std::string what = detail::concat("allreduce #", header_.seq, ": send to rank ", s.peer,
                                            " failed: ", mpi_error_string(error));
    record_failure(std::make_exception_ptr(CommunicationError(what, __FILE__, __LINE__)), what,
                   AbortKind::error, rank_);
  }
  if (--outstanding_ > 0) return;
  if (done_) return;  // hard abort already finished the protocol
  finish_step(t);
}

void RecursiveDoublingOp::finish_step(Transport& t) {
  const Step& s = steps_[step_];
  if (!failed_ && s.recv && recv_ok_ && data_.numel > 0) {
    TensorView theirs(recv_buf_.data() + sizeof(Prefix), data_.numel, data_.dtype);
    if (s.kind == StepKind::fold_out_recv) {
      std::memcpy(data_.data, theirs.data, data_.nbytes());
    } else if (s.peer < rank_) {
      // Lower rank first: theirs op mine, written back into data.
      kernels::reduce_into(theirs, data_, op_, ctx_);
      std::memcpy(data_.data, theirs.data, data_.nbytes());
    } else {
      kernels::reduce_into(data_, theirs, op_, ctx_);
    }
  }
  ++step_;
  posted_ = false;
  if (step_ == steps_.size()) {
    const StepKind last = steps_.back().kind;
    if (!failed_ && op_ == ReduceOp::avg && last == StepKind::round)
      kernels::finish_average(data_, size_, ctx_);
    done_ = true;
    return;
  }
  post_step(t);
}

void RecursiveDoublingOp::abort(Transport& t, std::exception_ptr error) {
  const AbortCause cause = abort_cause(error);
  record_failure(error, cause.reason, cause.kind, rank_);
  if (cause.kind == AbortKind::poisoned) {
    t.cancel_receives(*this, 1);
    probing_ = false;
    done_ = true;
  }
}

std::string RecursiveDoublingOp::waiting_for() const {
  if (done_ || step_ >= steps_.size()) return {};
  std::ostringstream os;
  os << "rank " << steps_[step_].peer << " (step " << step_ + 1 << "/" << steps_.size() << ")";
  return os.str();
}

}  // namespace relaxcc::mpi
