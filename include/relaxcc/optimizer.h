// A small framework-free optimizer interface over flat f32 buffers, for
// algorithms that own the optimizer step and for frameworks without one.
// Frontends may supply their own. State (momenta) is keyed by the flat
// offset of the parameter, so it survives bucket plan rebuilds.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "relaxcc/state_dict.h"
#include "relaxcc/tensor.h"

namespace relaxcc {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Updates params (f32, host) from grads of the same shape. `key` is the
  // parameter's flat offset.
  virtual void update(const TensorView& params, const TensorView& grads, int64_t key) = 0;
  // Ends the optimizer step (advances the step counter used for bias
  // correction).
  void finish_step() { ++steps_; }
  int64_t steps() const { return steps_; }
  virtual StateDict state_dict() const;
  virtual void load_state_dict(const StateDict& state);

 protected:
  static void check(const TensorView& params, const TensorView& grads);
  std::vector<float>& slot(const char* name, int64_t key, int64_t numel);
  int64_t steps_ = 0;
  std::map<std::string, std::map<int64_t, std::vector<float>>> state_;
};

struct SgdOptions {
  float lr = 0.01f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

// PyTorch's SGD: d = g + wd p; b = mu b + (1 - dampening) d (b = d at first);
// d = nesterov ? d + mu b : b; p -= lr d.
class Sgd final : public Optimizer {
 public:
  explicit Sgd(SgdOptions options = {});
  void update(const TensorView& params, const TensorView& grads, int64_t key) override;

 private:
  SgdOptions o_;
};

struct AdamOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled_weight_decay = false;  // AdamW
};

// Adam and AdamW with bias correction, as in PyTorch.
class Adam final : public Optimizer {
 public:
  explicit Adam(AdamOptions options = {});
  void update(const TensorView& params, const TensorView& grads, int64_t key) override;

 private:
  AdamOptions o_;
};

}  // namespace relaxcc
