// ComputeOp: a caller's function run on the engine's compute thread
// (Communicator::compute), so that the engine keeps moving bytes meanwhile.
// It posts no requests; its Work completes once the function returned.
#pragma once

#include <functional>
#include <utility>

#include "engine.h"

namespace relaxcc::mpi {

class ComputeOp final : public Operation {
 public:
  ComputeOp(std::function<void()> fn, int priority)
      : Operation("compute", priority), fn_(std::move(fn)) {}

  void start(Transport& t) override { t.compute(*this, 0, std::exchange(fn_, nullptr)); }
  void on_computed(Transport&, int64_t, std::exception_ptr error) override {
    if (error) set_error(std::move(error));
    finished_ = true;
  }
  void on_complete(Transport&, int64_t, const MPI_Status&, int) override {}
  // A poisoned lane or a failed dependency: the Work fails (once a function
  // already running returned).
  void abort(Transport&, std::exception_ptr error) override {
    set_error(std::move(error));
    finished_ = true;
  }
  bool done() const override { return finished_; }
  // Local: it takes no collective sequence number (and so no tag).
  bool collective() const override { return false; }

 private:
  std::function<void()> fn_;
  bool finished_ = false;
};

}  // namespace relaxcc::mpi
