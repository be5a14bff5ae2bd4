#include "relaxcc/algorithms/local_sgd.h"

#include "relaxcc/errors.h"

namespace relaxcc::algorithms {

LocalSgd::LocalSgd(LocalSgdOptions options) : options_(options) {
  RELAXCC_ENFORCE(options_.period >= 1 && options_.warmup_steps >= 0, InvalidArgument,
                  "local_sgd: period >= 1 and warmup_steps >= 0, got ", options_.period, " and ",
                  options_.warmup_steps);
}

AlgorithmCapabilities LocalSgd::capabilities() const {
  AlgorithmCapabilities c;
  c.communicates_gradients = options_.warmup_steps > 0;
  return c;
}

WorkPtr LocalSgd::on_bucket_ready(const StepInfo& step, int bucket, const TensorView& data) {
  if (!warming_up(step)) return nullptr;  // local step: gradients stay here
  AllreduceOptions o;
  o.op = ReduceOp::avg;
  o.label = "warmup bucket " + std::to_string(bucket);
  return ctx_.comm->allreduce(data, ctx_.exec, o);
}

WorkPtr LocalSgd::after_optimizer_step(const StepInfo& step) {
  if (warming_up(step)) return nullptr;
  const int64_t local_steps = step.step - options_.warmup_steps + 1;
  if (local_steps % options_.period != 0) return nullptr;
  // Average every parameter: one allreduce per tensor, waited together.
  std::vector<WorkPtr> works;
  AllreduceOptions o;
  o.op = ReduceOp::avg;
  for (const TensorSpec& t : *ctx_.tensors) {
    if (t.role != TensorRole::parameter) continue;
    o.label = t.name;
    works.push_back(ctx_.comm->allreduce(t.view, ctx_.exec, o));
  }
  for (auto& w : works) w->wait();
  ++averages_;
  return nullptr;
}

StateDict LocalSgd::state_dict() const {
  StateDict sd;
  sd.put_int("local_sgd/averages", averages_);
  return sd;
}

void LocalSgd::load_state_dict(const StateDict& state) {
  averages_ = state.get_int("local_sgd/averages");
}

}  // namespace relaxcc::algorithms
