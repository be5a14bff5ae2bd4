#include "buffer_checks.h"

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
