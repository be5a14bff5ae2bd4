#include "src/collectives/argument_checks.h"

#include <numeric>

#include "relaxcc/errors.h"

namespace relaxcc {

namespace {
std::string byte_range(const TensorView& t) {
  return detail::concat("[", t.data, ", +", t.nbytes(), " B)");
}

const char* kind_name(const P2POp& op) {
  return op.kind == P2POp::Kind::send ? "send to" : "receive from";
}
}  // namespace

void check_tensor(const TensorView& t, const char* what) {
  t.check_valid(what);
  RELAXCC_ENFORCE(static_cast<int>(t.dtype) < kNumDTypes, InvalidArgument, what, ": unknown dtype ",
                  static_cast<int>(t.dtype));
}

void check_reduce_op(ReduceOp op, const char* what) {
  RELAXCC_ENFORCE(static_cast<int>(op) <= static_cast<int>(ReduceOp::max), InvalidArgument, what,
                  ": unknown reduce op ", static_cast<int>(op));
}

void check_allreduce(const TensorView& input, const TensorView& output,
                     const AllreduceOptions& options) {
  check_tensor(input, "allreduce input");
  check_tensor(output, "allreduce output");
  check_reduce_op(options.op, "allreduce");
  RELAXCC_ENFORCE_EQ(input.dtype, output.dtype, InvalidArgument,
                     "allreduce: input and output dtypes");
  RELAXCC_ENFORCE_EQ(input.numel, output.numel, InvalidArgument,
                     "allreduce: input and output elements");
  check_aliasing("allreduce", input, output, &output);
}

void check_reduce_scatter(const TensorView& input, const TensorView& output,
                          const ReduceScatterOptions& options, int size) {
  check_tensor(input, "reduce_scatter input");
  check_tensor(output, "reduce_scatter output");
  check_reduce_op(options.op, "reduce_scatter");
  RELAXCC_ENFORCE_EQ(input.dtype, output.dtype, InvalidArgument,
                     "reduce_scatter: input and output dtypes");
  RELAXCC_ENFORCE_EQ(input.numel, output.numel * size, InvalidArgument,
                     "reduce_scatter: input elements must be size() x output elements");
  check_aliasing("reduce_scatter", input, output, nullptr);
}

TensorView check_allgatherv(const TensorView& input, const TensorView& output,
                            const std::vector<int64_t>& counts, int rank, int size) {
  check_tensor(input, "allgather input");
  check_tensor(output, "allgather output");
  RELAXCC_ENFORCE_EQ(input.dtype, output.dtype, InvalidArgument,
                     "allgather: input and output dtypes");
  RELAXCC_ENFORCE_EQ(static_cast<int>(counts.size()), size, InvalidArgument,
                     "allgatherv: one count per rank");
  for (int64_t c : counts) RELAXCC_ENFORCE_GE(c, 0, InvalidArgument, "allgatherv: counts");
  RELAXCC_ENFORCE_EQ(counts[rank], input.numel, InvalidArgument,
                     "allgatherv: counts[rank()] must equal the input elements");
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  RELAXCC_ENFORCE_EQ(output.numel, total, InvalidArgument,
                     "allgather: output elements must be the sum of counts");
  const int64_t offset = std::accumulate(counts.begin(), counts.begin() + rank, int64_t{0});
  const TensorView own_slot = output.slice(offset, input.numel);
  check_aliasing("allgather", input, output, &own_slot);
  return own_slot;
}

void check_broadcast(const TensorView& data, const BroadcastOptions& options, int size) {
  check_tensor(data, "broadcast tensor");
  RELAXCC_ENFORCE(options.root >= 0 && options.root < size, InvalidArgument, "broadcast: root ",
                  options.root, " is not a rank of this communicator of ", size);
}

void check_alltoall(const TensorView& input, int size) {
  RELAXCC_ENFORCE(input.numel % size == 0, InvalidArgument, "alltoall: ", input.numel,
                  " input elements do not split into ", size, " blocks");
}

void check_alltoallv(const TensorView& input, const std::vector<int64_t>& send_counts,
                     const TensorView& output, const std::vector<int64_t>& recv_counts, int size) {
  check_tensor(input, "alltoall input");
  check_tensor(output, "alltoall output");
  RELAXCC_ENFORCE_EQ(input.dtype, output.dtype, InvalidArgument,
                     "alltoall: input and output dtypes");
  RELAXCC_ENFORCE(
      static_cast<int>(send_counts.size()) == size && static_cast<int>(recv_counts.size()) == size,
      InvalidArgument, "alltoallv: one send and one receive count per rank");
  int64_t sent = 0, received = 0;
  for (int p = 0; p < size; ++p) {
    RELAXCC_ENFORCE(send_counts[p] >= 0 && recv_counts[p] >= 0, InvalidArgument,
                    "alltoallv: negative count for rank ", p);
    sent += send_counts[p];
    received += recv_counts[p];
  }
  RELAXCC_ENFORCE_EQ(sent, input.numel, InvalidArgument,
                     "alltoallv: input elements vs sum of send_counts");
  RELAXCC_ENFORCE_EQ(received, output.numel, InvalidArgument,
                     "alltoallv: output elements vs sum of recv_counts");
  check_aliasing("alltoall", input, output, nullptr);
}

void check_point_to_point(const std::vector<P2POp>& ops, const P2POptions& options, int size,
                          int max_tag) {
  for (const P2POp& op : ops) {
    check_tensor(op.tensor, "point_to_point tensor");
    RELAXCC_ENFORCE(op.peer >= 0 && op.peer < size, InvalidArgument, "point_to_point: peer ",
                    op.peer, " is not a rank of this communicator of ", size);
    RELAXCC_ENFORCE(op.tag >= 0 && op.tag <= max_tag, InvalidArgument, "point_to_point: tag ",
                    op.tag, " outside [0, ", max_tag, "]");
  }
  check_aliasing(ops);
  // Built only when a check fails.
  const auto what = [&] { return "point_to_point" + detail::of_label(options.label); };
  RELAXCC_ENFORCE(!options.deadline || options.round != 0, InvalidArgument, what(),
                  ": a deadline needs a round (P2POptions::round > 0)");
  RELAXCC_ENFORCE(!options.started_deadline || options.deadline, InvalidArgument, what(),
                  ": started_deadline needs a deadline (P2POptions::deadline)");
  RELAXCC_ENFORCE(!options.started_deadline || *options.started_deadline >= *options.deadline,
                  InvalidArgument, what(),
                  ": started_deadline must not be earlier than the deadline");
  RELAXCC_ENFORCE(!options.keep_late || options.deadline, InvalidArgument, what(),
                  ": keep_late needs a deadline (P2POptions::deadline)");
}

bool overlap(const TensorView& a, const TensorView& b) noexcept {
  const auto* pa = static_cast<const unsigned char*>(a.data);
  const auto* pb = static_cast<const unsigned char*>(b.data);
  return a.nbytes() > 0 && b.nbytes() > 0 && pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

void check_aliasing(const char* op, const TensorView& input, const TensorView& output,
                    const TensorView* in_place) {
  if (!overlap(input, output)) return;
  if (in_place != nullptr && input.data == in_place->data && input.nbytes() == in_place->nbytes())
    return;
  RELAXCC_THROW(InvalidArgument, op, ": input ", byte_range(input), " and output ",
                byte_range(output), " overlap; ",
                in_place != nullptr
                    ? detail::concat("the input must be exactly ", byte_range(*in_place),
                                     " (in place) or lie outside the output")
                    : std::string("the output must not overlap the input"));
}

void check_aliasing(const std::vector<P2POp>& ops) {
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind != P2POp::Kind::recv) continue;
    for (size_t j = 0; j < ops.size(); ++j) {
      if (j == i || !overlap(ops[i].tensor, ops[j].tensor)) continue;
      RELAXCC_THROW(InvalidArgument, "point_to_point: op ", i, " (receive from rank ", ops[i].peer,
                    ", tag ", ops[i].tag, ") writes ", byte_range(ops[i].tensor),
                    ", which overlaps op ", j, " (", kind_name(ops[j]), " rank ", ops[j].peer,
                    ", tag ", ops[j].tag, ") at ", byte_range(ops[j].tensor),
                    "; a receive's buffer must not overlap any other buffer of the batch");
    }
  }
}

}  // namespace relaxcc
