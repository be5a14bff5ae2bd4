#include "relaxcc/algorithms/qadam.h"

#include <cmath>

#include "relaxcc/errors.h"

namespace relaxcc::algorithms {

QAdam::QAdam(QAdamOptions options) : options_(options) {
  const QAdamOptions& o = options_;
  RELAXCC_ENFORCE(
      o.codec == kernels::CompressorKind::minmax || o.codec == kernels::CompressorKind::sign,
      InvalidArgument, "qadam: codec must be minmax or sign, got ",
      kernels::compressor_name(o.codec));
  RELAXCC_ENFORCE(o.bits == 8 || o.bits == 4 || o.bits == 2 || o.bits == 1, InvalidArgument,
                  "qadam: bits must be 8, 4, 2 or 1 (within 1..8), got ", o.bits);
  RELAXCC_ENFORCE(o.warmup_steps >= 0, InvalidArgument, "qadam: warmup_steps must be >= 0, got ",
                  o.warmup_steps);
  RELAXCC_ENFORCE(o.chunk >= 1, InvalidArgument, "qadam: chunk must be >= 1, got ", o.chunk);
  const AdamOptions& a = o.adam;
  RELAXCC_ENFORCE(
      a.lr > 0 && a.eps > 0 && a.beta1 >= 0 && a.beta1 < 1 && a.beta2 >= 0 && a.beta2 < 1,
      InvalidArgument, "qadam: lr > 0, eps > 0 and betas in [0, 1), got lr ", a.lr, ", eps ", a.eps,
      ", betas ", a.beta1, " and ", a.beta2);
}

AlgorithmCapabilities QAdam::capabilities() const {
  AlgorithmCapabilities c;
  c.depends_on_bucket_boundaries = true;  // chunk scales span a bucket's values
  c.owns_optimizer_step = true;
  c.takes_learning_rate = true;
  c.survives_view_change = true;  // BucketFeedback::rebind; load_state_dict drops dispatches
  return c;
}

void QAdam::set_learning_rate(float lr) {
  RELAXCC_ENFORCE(lr > 0, InvalidArgument, "qadam: lr must be > 0, got ", lr);
  options_.adam.lr = lr;
}

void QAdam::init(const AlgorithmContext& ctx) {
  ctx_ = ctx;  // dispatched_ stays: a rebuild may come before the step's update
  feedback_.rebind(ctx, ctx.comm->rank(), ctx.comm->size(), static_cast<float>(ctx.comm->size()));
}

std::vector<float>& QAdam::slot(std::map<int64_t, std::vector<float>>& slots, int64_t key,
                                int64_t numel) {
  std::vector<float>& s = slots[key];
  if (s.empty()) s.assign(static_cast<size_t>(numel), 0.0f);
  RELAXCC_ENFORCE_EQ(static_cast<int64_t>(s.size()), numel, InvalidArgument,
                     "qadam: state of the parameter at flat offset ", key);
  return s;
}

WorkPtr QAdam::on_bucket_ready(const StepInfo& step, int bucket, const TensorView& data) {
  const Bucket& b = ctx_.plan->buckets()[static_cast<size_t>(bucket)];
  RELAXCC_ENFORCE(b.dtype == DType::f32 && data.device.is_host(), InvalidArgument, "qadam: bucket ",
                  bucket, " must hold f32 host gradients");
  dispatched_.push_back({step.step, data, b.entries});
  if (warming_up(step)) {
    AllreduceOptions o;
    o.op = ReduceOp::avg;
    o.label = "qadam warmup bucket " + std::to_string(bucket);
    return ctx_.comm->allreduce(data, ctx_.exec, o);
  }
  // The bucket's gradients become this rank's momentum.
  const AdamOptions& a = options_.adam;
  const float b1 = a.beta1, wd = a.decoupled_weight_decay ? 0.0f : a.weight_decay;
  float* x = data.as<float>();
  for (const BucketEntry& e : b.entries) {
    const TensorSpec& g = (*ctx_.tensors)[static_cast<size_t>(e.tensor)];
    if (g.partner < 0) continue;
    const TensorView& p = (*ctx_.tensors)[static_cast<size_t>(g.partner)].view;
    const std::vector<float>& m = slot(m_, ctx_.flat_offset[g.partner], e.numel);
    const float* pv = p.as<float>();
    float* gv = x + e.offset;
    for (int64_t j = 0; j < e.numel; ++j)
      gv[j] = b1 * m[static_cast<size_t>(j)] + (1.0f - b1) * (gv[j] + wd * pv[j]);
  }
  CompressedAllreduceOptions o;
  o.codec = kernels::CompressorConfig{};
  o.codec->kind = options_.codec;
  o.codec->bits = options_.bits;
  o.codec->chunk = options_.chunk;
  o.op = ReduceOp::avg;
  o.state = feedback_.state(bucket);
  o.label = "qadam momentum bucket " + std::to_string(bucket);
  return compressed_allreduce(*ctx_.comm, data, ctx_.exec, o);
}

void QAdam::optimizer_step(const StepInfo& step, Optimizer&) {
  const AdamOptions& o = options_.adam;
  const float l2 = o.decoupled_weight_decay ? 0.0f : o.weight_decay;
  const bool warm = warming_up(step);
  const double t = static_cast<double>(step.step + 1);
  const float c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(o.beta1), t));
  // The variance's bias correction freezes with it, at the last warmup step.
  const double tv = warm ? t : static_cast<double>(std::max(options_.warmup_steps, 1));
  const float c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(o.beta2), tv));
  for (const Dispatched& sent : dispatched_) {
    if (sent.step != step.step) continue;  // left from a step that never finished
    const float* x = sent.data.as<float>();
    for (const BucketEntry& e : sent.entries) {
      const TensorSpec& g = (*ctx_.tensors)[static_cast<size_t>(e.tensor)];
      if (g.partner < 0) continue;
      const int64_t key = ctx_.flat_offset[g.partner];
      float* p = (*ctx_.tensors)[static_cast<size_t>(g.partner)].view.as<float>();
      std::vector<float>& m = slot(m_, key, e.numel);
      std::vector<float>& v = slot(v_, key, e.numel);
      const float* gv = x + e.offset;
      for (int64_t j = 0; j < e.numel; ++j) {
        const size_t k = static_cast<size_t>(j);
        if (warm) {
          const float d = gv[j] + l2 * p[j];
          m[k] = o.beta1 * m[k] + (1.0f - o.beta1) * d;
          v[k] = o.beta2 * v[k] + (1.0f - o.beta2) * d * d;
        } else {
          m[k] = gv[j];  // the averaged momentum
        }
        if (o.decoupled_weight_decay) p[j] -= o.lr * o.weight_decay * p[j];
        p[j] -= o.lr * (m[k] / c1) / (std::sqrt(v[k] / c2) + o.eps);
      }
    }
  }
  dispatched_.clear();
}

StateDict QAdam::replicated_state_dict() const {
  StateDict sd;
  for (const auto& [key, m] : m_) sd.put_floats("qadam/m@" + std::to_string(key), m);
  for (const auto& [key, v] : v_) sd.put_floats("qadam/v@" + std::to_string(key), v);
  return sd;
}

void QAdam::load_replicated_state_dict(const StateDict& state) {
  m_.clear();
  v_.clear();
  const auto read = [&state](const std::string& prefix, std::map<int64_t, std::vector<float>>& to) {
    for (const auto& entry : state.entries)
      if (entry.first.compare(0, prefix.size(), prefix) == 0)
        to[std::stoll(entry.first.substr(prefix.size()))] = state.get_floats(entry.first);
  };
  read("qadam/m@", m_);
  read("qadam/v@", v_);
}

StateDict QAdam::state_dict() const {
  StateDict sd = replicated_state_dict();
  feedback_.save(sd, "qadam/feedback/");
  return sd;
}

void QAdam::load_state_dict(const StateDict& state) {
  dispatched_.clear();  // a state is of a step's start: nothing dispatched yet
  load_replicated_state_dict(state);
  feedback_.load(state, "qadam/feedback/");
}

}  // namespace relaxcc::algorithms
