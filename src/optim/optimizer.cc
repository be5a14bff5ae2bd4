#include "relaxcc/optimizer.h"

#include <cmath>

#include "relaxcc/errors.h"

namespace relaxcc {

void Optimizer::check(const TensorView& params, const TensorView& grads) {
  params.check_valid("optimizer params");
  grads.check_valid("optimizer grads");
  RELAXCC_ENFORCE(params.dtype == DType::f32 && grads.dtype == DType::f32 &&
                      params.device.is_host() && grads.device.is_host(),
                  Unsupported, "optimizer: host f32 tensors");
  RELAXCC_ENFORCE_EQ(params.numel, grads.numel, InvalidArgument,
                     "optimizer: params vs grads elements");
}

std::vector<float>& Optimizer::slot(const char* name, int64_t key, int64_t numel) {
  auto& buf = state_[name][key];
  if (buf.size() != static_cast<size_t>(numel)) buf.assign(static_cast<size_t>(numel), 0.0f);
  return buf;
}

StateDict Optimizer::state_dict() const {
  StateDict sd;
  sd.put_int("steps", steps_);
  for (const auto& [name, by_key] : state_)
    for (const auto& [key, values] : by_key)
      sd.put_floats(name + "@" + std::to_string(key), values);
  return sd;
}

void Optimizer::load_state_dict(const StateDict& sd) {
  steps_ = sd.get_int("steps");
  state_.clear();
  for (const auto& [k, v] : sd.entries) {
    const size_t at = k.find('@');
    if (at == std::string::npos) continue;
    state_[k.substr(0, at)][std::stoll(k.substr(at + 1))] = sd.get_floats(k);
  }
}

Sgd::Sgd(SgdOptions options) : o_(options) {
  RELAXCC_ENFORCE(o_.lr >= 0 && o_.momentum >= 0, InvalidArgument,
                  "SGD: lr and momentum must be >= 0");
  RELAXCC_ENFORCE(!o_.nesterov || (o_.momentum > 0 && o_.dampening == 0), InvalidArgument,
                  "SGD: Nesterov needs momentum > 0 and no dampening");
}

void Sgd::update(const TensorView& params, const TensorView& grads, int64_t key) {
  check(params, grads);
  float* p = params.as<float>();
  const float* g = grads.as<const float>();
  const int64_t n = params.numel;
  if (o_.momentum == 0.0f) {
    for (int64_t i = 0; i < n; ++i) p[i] -= o_.lr * (g[i] + o_.weight_decay * p[i]);
    return;
  }
  const bool first = state_["momentum"].count(key) == 0;
  std::vector<float>& b = slot("momentum", key, n);
  for (int64_t i = 0; i < n; ++i) {
    const float d = g[i] + o_.weight_decay * p[i];
    b[i] = first ? d : o_.momentum * b[i] + (1.0f - o_.dampening) * d;
    p[i] -= o_.lr * (o_.nesterov ? d + o_.momentum * b[i] : b[i]);
  }
}

Adam::Adam(AdamOptions options) : o_(options) {
  RELAXCC_ENFORCE(
      o_.lr >= 0 && o_.beta1 >= 0 && o_.beta1 < 1 && o_.beta2 >= 0 && o_.beta2 < 1 && o_.eps > 0,
      InvalidArgument, "Adam: lr >= 0, betas in [0, 1), eps > 0");
}

void Adam::update(const TensorView& params, const TensorView& grads, int64_t key) {
  check(params, grads);
  float* p = params.as<float>();
  const float* g = grads.as<const float>();
  const int64_t n = params.numel;
  std::vector<float>& m = slot("exp_avg", key, n);
  std::vector<float>& v = slot("exp_avg_sq", key, n);
  const double t = static_cast<double>(steps_ + 1);
  const float c1 = static_cast<float>(1.0 - std::pow(o_.beta1, t));
  const float c2 = static_cast<float>(1.0 - std::pow(o_.beta2, t));
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i];
    if (o_.decoupled_weight_decay)
      p[i] *= 1.0f - o_.lr * o_.weight_decay;
    else
      gi += o_.weight_decay * p[i];
    m[i] = o_.beta1 * m[i] + (1.0f - o_.beta1) * gi;
    v[i] = o_.beta2 * v[i] + (1.0f - o_.beta2) * gi * gi;
    const float denom = std::sqrt(v[i] / c2) + o_.eps;
    p[i] -= o_.lr * (m[i] / c1) / denom;
  }
}

}  // namespace relaxcc
