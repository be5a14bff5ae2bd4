#include "relaxcc/algorithms/bucket_weights.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "relaxcc/errors.h"

namespace relaxcc::algorithms {

void BucketWeights::rebind(const AlgorithmContext& ctx, const std::string& who) {
  ctx_ = ctx;
  previous_ = std::move(entries_);
  entries_.clear();
  buffers_.clear();
  for (const Bucket& b : ctx.plan->buckets()) {
    for (const BucketEntry& e : b.entries) {
      const TensorSpec& g = (*ctx.tensors)[static_cast<size_t>(e.tensor)];
      RELAXCC_ENFORCE(g.partner >= 0 && g.partner < static_cast<int>(ctx.tensors->size()),
                      InvalidArgument, who, ": gradient '", g.name,
                      "' has no partner parameter (TensorSpec::partner), got ", g.partner);
      const TensorView& p = (*ctx.tensors)[static_cast<size_t>(g.partner)].view;
      RELAXCC_ENFORCE(p.dtype == DType::f32 && p.device.is_host() && p.numel == e.numel,
                      InvalidArgument, who, ": the parameter of '", g.name,
                      "' must be f32 on the host with its gradient's ", e.numel, " elements, got ",
                      p.numel);
    }
    entries_.push_back(b.entries);
    buffers_.push_back(std::make_shared<std::vector<float>>(static_cast<size_t>(b.numel), 0.0f));
  }
}

TensorView BucketWeights::view(int bucket) const {
  const auto& buf = buffers_[static_cast<size_t>(bucket)];
  return TensorView::host(buf->data(), static_cast<int64_t>(buf->size()), buf);
}

void BucketWeights::gather(int bucket) {
  float* out = buffers_[static_cast<size_t>(bucket)]->data();
  for (const BucketEntry& e : entries_[static_cast<size_t>(bucket)]) {
    const TensorSpec& g = (*ctx_.tensors)[static_cast<size_t>(e.tensor)];
    const TensorView& p = (*ctx_.tensors)[static_cast<size_t>(g.partner)].view;
    std::memcpy(out + e.offset, p.data, p.nbytes());
  }
}

void BucketWeights::scatter(int bucket) const {
  const float* in = buffers_[static_cast<size_t>(bucket)]->data();
  for (const BucketEntry& e : entries_[static_cast<size_t>(bucket)]) {
    const TensorSpec& g = (*ctx_.tensors)[static_cast<size_t>(e.tensor)];
    const TensorView& p = (*ctx_.tensors)[static_cast<size_t>(g.partner)].view;
    std::memcpy(p.data, in + e.offset, p.nbytes());
  }
}

bool BucketWeights::unchanged(int bucket) const {
  const size_t b = static_cast<size_t>(bucket);
  if (b >= previous_.size()) return false;
  const auto& now = entries_[b];
  const auto& was = previous_[b];
  if (now.size() != was.size()) return false;
  for (size_t i = 0; i < now.size(); ++i) {
    if (now[i].tensor != was[i].tensor || now[i].offset != was[i].offset ||
        now[i].numel != was[i].numel)
      return false;
  }
  return true;
}

int64_t BucketWeights::weights(int bucket) const {
  int64_t n = 0;
  for (const BucketEntry& e : entries_[static_cast<size_t>(bucket)]) n += e.numel;
  return n;
}

void FlatParameters::bind(const AlgorithmContext& ctx, const std::string& who) {
  tensors.clear();
  offsets.clear();
  numel = 0;
  for (size_t i = 0; i < ctx.tensors->size(); ++i) {
    const TensorSpec& t = (*ctx.tensors)[i];
    if (t.role != TensorRole::parameter) continue;
    RELAXCC_ENFORCE(t.view.dtype == DType::f32 && t.view.device.is_host(), InvalidArgument, who,
                    ": parameter '", t.name, "' must be f32 on the host");
    tensors.push_back(static_cast<int>(i));
    offsets.push_back(numel);
    numel += t.view.numel;
  }
}

void average_parameters(const AlgorithmContext& ctx, const std::string& label,
                        std::chrono::milliseconds timeout) {
  std::vector<WorkPtr> works;
  AllreduceOptions o;
  o.op = ReduceOp::avg;
  for (const TensorSpec& t : *ctx.tensors) {
    if (t.role != TensorRole::parameter) continue;
    o.label = label + " " + t.name;
    works.push_back(ctx.comm->allreduce(t.view, ctx.exec, o));
  }
  const auto start = std::chrono::steady_clock::now();
  for (auto& w : works) w->wait(timeout_left(timeout, start));
}

std::chrono::milliseconds timeout_left(std::chrono::milliseconds timeout,
                                       std::chrono::steady_clock::time_point start) {
  if (timeout.count() < 0) return timeout;
  const auto spent =
      std::chrono::floor<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  return std::max(std::chrono::milliseconds(0), timeout - spent);
}

WeightRounds::WeightRounds(std::string who, int interval)
    : who_(std::move(who)), interval_(interval) {
  RELAXCC_ENFORCE(interval >= 1, InvalidArgument, who_,
                  ": the communication interval must be >= 1, got ", interval);
}

AlgorithmCapabilities WeightRounds::capabilities() const {
  AlgorithmCapabilities c;
  c.communicates_gradients = false;
  return c;
}

void WeightRounds::init(const AlgorithmContext& ctx) {
  ctx_ = ctx;
  weights_.rebind(ctx, who_);
  rounds_.assign(static_cast<size_t>(weights_.buckets()), nullptr);
  bound();
}

WorkPtr WeightRounds::on_bucket_ready(const StepInfo& step, int bucket, const TensorView&) {
  if (!communicates(step)) return nullptr;
  weights_.gather(bucket);
  const uint64_t round = static_cast<uint64_t>(step.step / interval_) + 1;
  WorkPtr w = start_round(bucket, round, weights_.view(bucket));
  rounds_[static_cast<size_t>(bucket)] = w;
  return w;
}

void WeightRounds::before_optimizer_step(const StepInfo& step) {
  if (!communicates(step)) return;
  // The Reducer waited for every bucket's round in synchronize().
  for (int b = 0; b < weights_.buckets(); ++b) {
    WorkPtr& w = rounds_[static_cast<size_t>(b)];
    if (!w) continue;
    missing_ += static_cast<int64_t>(w->missing_peers().size());
    w.reset();
    weights_.scatter(b);
  }
}

void WeightRounds::average_model(std::chrono::milliseconds timeout) {
  average_parameters(ctx_, who_ + ": exact model average", timeout);
}

}  // namespace relaxcc::algorithms
