#include "relaxcc/algorithms/bytegrad.h"

#include "relaxcc/errors.h"

namespace relaxcc::algorithms {

ByteGrad::ByteGrad(ByteGradOptions options) : options_(options) {
  RELAXCC_ENFORCE(
      options_.bits == 8 || options_.bits == 4 || options_.bits == 2 || options_.bits == 1,
      InvalidArgument, "bytegrad: bits must be 8, 4, 2 or 1 (within 1..8), got ", options_.bits);
  RELAXCC_ENFORCE(options_.chunk >= 1, InvalidArgument, "bytegrad: chunk must be >= 1, got ",
                  options_.chunk);
}

AlgorithmCapabilities ByteGrad::capabilities() const {
  AlgorithmCapabilities c;
  c.depends_on_bucket_boundaries = true;            // a chunk's scale spans its bucket's values
  c.survives_view_change = !options_.hierarchical;  // BucketFeedback::rebind; as gradient_allreduce
  return c;
}

void ByteGrad::init(const AlgorithmContext& ctx) {
  // Built once per communicator (a view change brings another one).
  if (options_.hierarchical && (!have_hierarchy_ || ctx.comm != ctx_.comm)) {
    hierarchy_ = build_hierarchy(*ctx.comm, ctx.tunables);
    have_hierarchy_ = true;
  }
  ctx_ = ctx;
  // On one node the hierarchy would quantize nothing: the flat compressed
  // allreduce runs there (the layout is the same on every rank).
  use_hierarchy_ = have_hierarchy_ && hierarchy_.layout.num_nodes > 1;
  if (!options_.error_feedback) return;
  // The error feedback lives where values are quantized: on the inter-node
  // communicator's leaders when hierarchical, on every rank otherwise.
  const Communicator* on = use_hierarchy_ ? hierarchy_.inter.get() : ctx.comm.get();
  if (on != nullptr)
    feedback_.rebind(ctx, on->rank(), on->size(),
                     options_.average ? static_cast<float>(on->size()) : 1.0f);
}

WorkPtr ByteGrad::on_bucket_ready(const StepInfo&, int bucket, const TensorView& data) {
  CompressedAllreduceOptions o;
  o.codec = kernels::CompressorConfig{};
  o.codec->kind = kernels::CompressorKind::minmax;
  o.codec->bits = options_.bits;
  o.codec->chunk = options_.chunk;
  o.codec->rounding = options_.rounding;
  o.op = options_.average ? ReduceOp::avg : ReduceOp::sum;
  o.label = "bytegrad bucket " + std::to_string(bucket);
  if (!feedback_.empty()) o.state = feedback_.state(bucket);
  if (use_hierarchy_)
    return hierarchical_compressed_allreduce(*ctx_.comm, hierarchy_, data, ctx_.exec, o);
  return compressed_allreduce(*ctx_.comm, data, ctx_.exec, o);
}

StateDict ByteGrad::state_dict() const {
  StateDict sd;
  if (!feedback_.empty()) feedback_.save(sd, "bytegrad/");
  return sd;
}

void ByteGrad::load_state_dict(const StateDict& state) {
  if (!feedback_.empty()) feedback_.load(state, "bytegrad/");
}

}  // namespace relaxcc::algorithms
