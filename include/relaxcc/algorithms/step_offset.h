// StepOffset: an algorithm resumed at a later step. It forwards every hook to
// the wrapped algorithm with StepInfo::step moved by offset(): a Reducer
// counts its steps from 0, and a run resumed from a checkpoint saved after
// step k continues with the step numbers (warmup phases, rolling
// selections, periods) it had. Header-only, so frontends use it without
// linking relaxcc::algorithms.
#pragma once

#include <memory>
#include <string>

#include "relaxcc/algorithm.h"

namespace relaxcc::algorithms {

class StepOffset final : public Algorithm {
 public:
  explicit StepOffset(AlgorithmPtr inner, int64_t offset = 0)
      : inner_(std::move(inner)), offset_(offset) {}
  Algorithm& inner() { return *inner_; }
  void set_offset(int64_t offset) { offset_ = offset; }
  int64_t offset() const { return offset_; }

  std::string name() const override { return inner_->name(); }
  AlgorithmCapabilities capabilities() const override { return inner_->capabilities(); }
  void init(const AlgorithmContext& ctx) override { inner_->init(ctx); }
  WorkPtr on_step_begin(const StepInfo& s) override { return inner_->on_step_begin(at(s)); }
  WorkPtr on_bucket_ready(const StepInfo& s, int bucket, const TensorView& data) override {
    return inner_->on_bucket_ready(at(s), bucket, data);
  }
  bool reduces_gradients(const StepInfo& s) const override {
    return inner_->reduces_gradients(at(s));
  }
  WorkPtr on_backward_end(const StepInfo& s) override { return inner_->on_backward_end(at(s)); }
  void before_optimizer_step(const StepInfo& s) override { inner_->before_optimizer_step(at(s)); }
  void optimizer_step(const StepInfo& s, Optimizer& o) override {
    inner_->optimizer_step(at(s), o);
  }
  WorkPtr after_optimizer_step(const StepInfo& s) override {
    return inner_->after_optimizer_step(at(s));
  }
  bool need_reset(const StepInfo& s) const override { return inner_->need_reset(at(s)); }
  void drain(std::chrono::milliseconds t) override { inner_->drain(t); }
  void shutdown(std::chrono::milliseconds t) override { inner_->shutdown(t); }
  StateDict state_dict() const override { return inner_->state_dict(); }
  void load_state_dict(const StateDict& s) override { inner_->load_state_dict(s); }
  StateDict replicated_state_dict() const override {
    StateDict s = inner_->replicated_state_dict();
    s.put_int("step_offset", offset_);
    return s;
  }
  void load_replicated_state_dict(const StateDict& s) override {
    offset_ = s.get_int("step_offset");
    inner_->load_replicated_state_dict(s);
  }

 private:
  StepInfo at(const StepInfo& s) const { return StepInfo{s.step + offset_}; }
  AlgorithmPtr inner_;
  int64_t offset_ = 0;
};

}  // namespace relaxcc::algorithms
