#include "relaxcc/algorithms/gradient_allreduce.h"

#include "relaxcc/kernels/reduce.h"

namespace relaxcc::algorithms {

void GradientAllreduce::init(const AlgorithmContext& ctx) {
  // Built once per communicator (a view change brings another one).
  if (options_.hierarchical && (!have_hierarchy_ || ctx.comm != ctx_.comm)) {
    hierarchy_ = build_hierarchy(*ctx.comm, ctx.tunables);
    have_hierarchy_ = true;
  }
  ctx_ = ctx;
}

WorkPtr GradientAllreduce::on_bucket_ready(const StepInfo&, int bucket, const TensorView& data) {
  const std::string label = "bucket " + std::to_string(bucket);
  if (!options_.hierarchical) {
    AllreduceOptions o;
    o.op = options_.average ? ReduceOp::avg : ReduceOp::sum;
    o.label = label;
    return ctx_.comm->allreduce(data, ctx_.exec, o);
  }
  // Every stage is submitted now, in bucket order, each to run after the one
  // before: every stage has the same place in its communicator's order on
  // every rank, however the stages' timings differ.
  const HierarchicalComms& h = hierarchy_;
  AllreduceOptions sum;
  sum.label = label;
  WorkPtr reduced = h.intra->allreduce(data, ctx_.exec, sum);
  if (h.inter) {
    sum.after = reduced;
    reduced = h.inter->allreduce(data, ctx_.exec, sum);
  }
  BroadcastOptions down;
  down.label = label;
  down.after = reduced;
  WorkPtr result = h.intra->broadcast(data, ctx_.exec, down);
  if (!options_.average) return result;
  const ExecContext exec = ctx_.exec;
  const int world = ctx_.comm->size();
  return result->then([data, exec, world](const Work& done) {
    if (!done.exception()) kernels::finish_average(data, world, exec);
  });
}

}  // namespace relaxcc::algorithms
