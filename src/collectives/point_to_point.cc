#include "point_to_point.h"

#include <sstream>

#include "../mpi/op_header.h"
#include "relaxcc/errors.h"

namespace relaxcc::mpi {

P2PBatchOp::P2PBatchOp(std::vector<P2POp> ops, int priority, std::string label)
    : Operation("point_to_point", priority),
      ops_(std::move(ops)),
      headers_(ops_.size()),
      label_(std::move(label)),
      drain_(ops_.size()),
      pending_(ops_.size(), 0) {}

void P2PBatchOp::start(Transport& t) {
  started_ = true;
  for (size_t i = 0; i < ops_.size(); ++i) {
    const P2POp& op = ops_[i];
    const auto index = static_cast<int64_t>(i);
    if (op.kind == P2POp::Kind::send) {
      headers_[i] =
          Wire{kHeaderMagic, static_cast<uint8_t>(op.tensor.dtype), {0, 0, 0}, op.tensor.numel};
      t.isend(*this, index * 2, &headers_[i], sizeof(Wire), op.peer, 2 * op.tag, false);
    } else {
      t.irecv(*this, index * 2, &headers_[i], sizeof(Wire), op.peer, 2 * op.tag, false);
    }
    ++outstanding_;
    ++pending_[i];
  }
  post_data_sends(t);
}

void P2PBatchOp::progress(Transport& t) {
  if (!aborted_) post_data_sends(t);
}

void P2PBatchOp::post_data_sends(Transport& t) {
  for (; next_data_send_ < ops_.size(); ++next_data_send_) {
    const P2POp& op = ops_[next_data_send_];
    if (op.kind != P2POp::Kind::send) continue;
    if (data_sends_in_flight_ > 0 && t.throttled(*this)) return;
    t.isend(*this, static_cast<int64_t>(next_data_send_) * 2 + 1, op.tensor.data,
            op.tensor.nbytes(), op.peer, 2 * op.tag + 1, false);
    ++outstanding_;
    ++pending_[next_data_send_];
    ++data_sends_in_flight_;
  }
}

void P2PBatchOp::on_complete(Transport& t, int64_t slot, const MPI_Status& status, int error) {
  --outstanding_;
  const auto i = static_cast<size_t>(slot / 2);
  const bool is_header = slot % 2 == 0;
  const P2POp& op = ops_[i];
  --pending_[i];
  if (op.kind == P2POp::Kind::send && !is_header) --data_sends_in_flight_;
  int cancelled = 0;
  MPI_Test_cancelled(&status, &cancelled);
  if (cancelled) return;
  const std::string where =
      detail::concat("point_to_point", label_.empty() ? "" : " of '" + label_ + "'",
                     op.kind == P2POp::Kind::send ? ": send to rank " : ": receive from rank ",
                     op.peer, " (tag ", op.tag, ")");
  if (op.kind == P2POp::Kind::recv && is_header && error == MPI_SUCCESS && !aborted_) {
    const Wire& h = headers_[i];
    const auto index = static_cast<int64_t>(i);
    if (h.magic != kHeaderMagic || h.dtype >= kNumDTypes || h.count < 0) {
      // The data message's size is unknown: leave it; report the corruption.
      set_error(std::make_exception_ptr(
          CorruptPayload(where + ": corrupt message header", __FILE__, __LINE__)));
      return;
    }
    const auto dtype = static_cast<DType>(h.dtype);
    if (dtype == op.tensor.dtype && h.count == op.tensor.numel) {
      t.irecv(*this, index * 2 + 1, op.tensor.data, op.tensor.nbytes(), op.peer, 2 * op.tag + 1,
              false);
    } else {
      set_error(std::make_exception_ptr(PeerMismatch(
          detail::concat(where, ": expected ", op.tensor.numel, " elements of ", op.tensor.dtype,
                         ", the sender sent ", h.count, " elements of ", dtype),
          __FILE__, __LINE__)));
      const size_t bytes = static_cast<size_t>(h.count) * dtype_size(dtype);
      drain_[i] = t.scratch(bytes);
      t.irecv(*this, index * 2 + 1, drain_[i].data(), bytes, op.peer, 2 * op.tag + 1, false);
    }
    ++outstanding_;
    ++pending_[i];
    return;
  }
  if (error != MPI_SUCCESS) {
    set_error(std::make_exception_ptr(CommunicationError(
        detail::concat(where, ": ", mpi_error_string(error)), __FILE__, __LINE__)));
  }
}

void P2PBatchOp::abort(Transport& t, std::exception_ptr error) {
  set_error(std::move(error));
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (ops_[i].kind != P2POp::Kind::recv) continue;
    t.cancel_receives(*this, static_cast<int64_t>(i) * 2);
    t.cancel_receives(*this, static_cast<int64_t>(i) * 2 + 1);
  }
  // Sends cannot be cancelled: their requests stay parked in the engine.
  aborted_ = true;
}

std::string P2PBatchOp::waiting_for() const {
  // The sends and receives not completed yet (a send not posted yet counts).
  std::ostringstream os;
  const char* sep = "";
  for (size_t i = 0; i < ops_.size(); ++i) {
    const P2POp& op = ops_[i];
    const bool unposted = op.kind == P2POp::Kind::send && i >= next_data_send_;
    if (pending_[i] == 0 && !unposted) continue;
    os << sep << (op.kind == P2POp::Kind::send ? "send to rank " : "receive from rank ") << op.peer
       << " (tag " << op.tag << ")";
    sep = ", ";
  }
  return os.str();
}

}  // namespace relaxcc::mpi
