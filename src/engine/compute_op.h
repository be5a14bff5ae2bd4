// ComputeOp: a caller's function run on the engine's compute thread
// (Communicator::compute), so that the engine keeps moving bytes meanwhile.
// It posts no requests; its Work completes once the function returned, or
// at once when it is aborted before the function started (which then never
// runs).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <utility>

#include "src/engine/operation.h"
#include "src/engine/request_poster.h"

namespace relaxcc::engine {

class ComputeOp final : public Operation {
 public:
  ComputeOp(std::function<void()> fn, int priority)
      : Operation("compute", priority), fn_(std::move(fn)) {}

  void start(RequestPoster& t) override {
    t.compute(*this, 0, [fn = std::exchange(fn_, nullptr), phase = phase_] {
      Phase queued = Phase::queued;
      if (phase->compare_exchange_strong(queued, Phase::running)) fn();
    });
  }
  void on_computed(RequestPoster&, int64_t, std::exception_ptr error) override {
    if (error) set_error(std::move(error));
    finished_ = true;
  }
  void on_complete(RequestPoster&, int64_t, const Completion&) override {}
  // A poisoned lane or a failed dependency: the Work fails, and the function
  // never runs, unless it started already (then its own result stands).
  void abort(RequestPoster&, std::exception_ptr error) override {
    Phase queued = Phase::queued;
    if (!phase_->compare_exchange_strong(queued, Phase::cancelled)) return;
    set_error(std::move(error));
    finished_ = true;
  }
  bool done() const override { return finished_; }
  // Local: it takes no collective sequence number (and so no tag).
  bool collective() const override { return false; }

 private:
  enum class Phase { queued, running, cancelled };
  std::function<void()> fn_;
  // Shared with the function's wrapper on the compute thread.
  std::shared_ptr<std::atomic<Phase>> phase_ = std::make_shared<std::atomic<Phase>>(Phase::queued);
  bool finished_ = false;
};

}  // namespace relaxcc::engine
