#include "mpi_collective.h"

#include "relaxcc/errors.h"

namespace relaxcc::mpi {

MpiCollectiveOp::MpiCollectiveOp(std::string name, int priority, std::string label,
                                 std::vector<OpHeader> headers)
    : Operation(std::move(name), priority), label_(std::move(label)), out_(std::move(headers)), in_(out_.size()) {}

void MpiCollectiveOp::start(Transport& t) {
  for (auto& h : out_) h.seq = seq();
  progress(t);
}

void MpiCollectiveOp::start_failed(Transport& t, std::exception_ptr error) {
  // Takes part in the header exchange and the verdict, so that every rank
  // fails instead of waiting for this one; never runs the data collective.
  upstream_ = std::move(error);
  local_verdict_ = kUpstreamFailed;
  start(t);
}

void MpiCollectiveOp::progress(Transport& t) {
  if (stage_ != kWaitTurn || !t.collective_turn(*this)) return;
  stage_ = kHeaders;
  MPI_Request req;
  check_mpi(MPI_Ialltoall(out_.data(), sizeof(OpHeader), MPI_BYTE, in_.data(), sizeof(OpHeader),
                          MPI_BYTE, t.coll_comm(), &req),
            "MPI_Ialltoall (headers)");
  t.track(*this, kHeaders, req);
}

void MpiCollectiveOp::on_complete(Transport& t, int64_t slot, const MPI_Status&, int error) {
  if (done_) return;
  if (error != MPI_SUCCESS)
    RELAXCC_THROW(CommunicationError, name(), " #", seq(), ": ", mpi_error_string(error));
  switch (static_cast<Stage>(slot)) {
    case kHeaders: {
      const int me = t.rank();
      for (int p = 0; p < static_cast<int>(in_.size()) && local_verdict_ == 0; ++p) {
        if (!same_call(out_[p], in_[p])) {
          local_verdict_ = kMismatch;
          mismatch_ = describe_mismatch(me, out_[p], p, in_[p]);
        }
      }
      stage_ = kVerdict;
      MPI_Request req;
      check_mpi(MPI_Iallreduce(&local_verdict_, &global_verdict_, 1, MPI_INT, MPI_MAX, t.coll_comm(), &req),
                "MPI_Iallreduce (verdict)");
      t.track(*this, kVerdict, req);
      return;
    }
    case kVerdict: {
      if (global_verdict_ != 0) {
        const std::string where = detail::concat(name(), " #", seq(), label_.empty() ? "" : " of '" + label_ + "'");
        if (local_verdict_ == kUpstreamFailed) {
          set_error(upstream_);
        } else if (local_verdict_ == kMismatch) {
          set_error(std::make_exception_ptr(
              PeerMismatch(detail::concat(where, ": ranks disagree: ", mismatch_), __FILE__, __LINE__)));
        } else if (global_verdict_ == kMismatch) {
          set_error(std::make_exception_ptr(PeerMismatch(
              detail::concat(where, ": ranks disagree: another rank's call differs from its peer's "
                                    "(this rank calls ", describe(out_[t.rank()], t.rank()), ")"),
              __FILE__, __LINE__)));
        } else {
          set_error(std::make_exception_ptr(CommunicationError(
              detail::concat(where, ": another rank could not take part (a stage it runs after "
                                    "failed there)"),
              __FILE__, __LINE__)));
        }
        finish(t);
        return;
      }
      finish(t);
      return;
    }
    default:
      RELAXCC_THROW(InternalError, name(), ": unexpected completion ", slot);
  }
}

void MpiCollectiveOp::finish(Transport& t) {
  stage_ = kDone;
  done_ = true;
  t.end_collective_turn(*this);
}

void MpiCollectiveOp::abort(Transport& t, std::exception_ptr error) {
  // MPI cannot cancel a collective: whatever is posted stays parked.
  set_error(std::move(error));
  if (!done_) {
    done_ = true;
    t.end_collective_turn(*this);
  }
}

std::string MpiCollectiveOp::waiting_for() const {
  switch (stage_) {
    case kWaitTurn: return "earlier collectives on this communicator";
    case kHeaders: return "every rank to enter (header exchange)";
    case kVerdict: return "every rank's verdict";
    default: return {};
  }
}

}  // namespace relaxcc::mpi
