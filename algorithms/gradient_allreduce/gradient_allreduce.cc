#include "gradient_allreduce.h"

#include "relaxcc/kernels/reduce.h"
#include "relaxcc/work_chain.h"

namespace relaxcc::algorithms {

void GradientAllreduce::init(const AlgorithmContext& ctx) {
  ctx_ = ctx;
  if (options_.hierarchical && !have_hierarchy_) {
    hierarchy_ = build_hierarchy(*ctx.comm, ctx.tunables);
    have_hierarchy_ = true;
  }
}

WorkPtr GradientAllreduce::on_bucket_ready(const StepInfo&, int bucket, const TensorView& data) {
  const std::string label = "bucket " + std::to_string(bucket);
  if (!options_.hierarchical) {
    AllreduceOptions o;
    o.op = options_.average ? ReduceOp::avg : ReduceOp::sum;
    o.label = label;
    return ctx_.comm->allreduce(data, ctx_.exec, o);
  }
  const HierarchicalComms& h = hierarchy_;
  const ExecContext exec = ctx_.exec;
  const bool average = options_.average;
  const int world = ctx_.comm->size();
  AllreduceOptions sum;
  sum.label = label;
  return chain_works(
      {[h, data, exec, sum] { return h.intra->allreduce(data, exec, sum); },
       [h, data, exec, sum]() -> WorkPtr { return h.inter ? h.inter->allreduce(data, exec, sum) : nullptr; },
       [h, data, exec] { return h.intra->broadcast(data, exec, {}); },
       [data, exec, average, world]() -> WorkPtr {
         if (average) kernels::finish_average(data, world, exec);
         return nullptr;
       }},
      std::chrono::milliseconds(ctx_.tunables.timeout_ms), "hierarchical allreduce of " + label);
}

}  // namespace relaxcc::algorithms
