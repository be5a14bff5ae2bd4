// EngineWork: the Work of an engine operation.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "relaxcc/work.h"
#include "src/engine/engine.h"
#include "src/engine/operation.h"

namespace relaxcc::engine {

// The Work of an engine operation: a waiter drives the engine's progress;
// an expiring wait() poisons its lane (if the engine and the lane still
// exist).
class EngineWork final : public Work {
 public:
  // Described as "<name> #<seq> of '<label>' (tag <tag>, <details>)".
  EngineWork(const Operation& op, const std::string& label, int tag, Engine::Details details,
             std::chrono::milliseconds default_timeout, std::weak_ptr<Engine> engine,
             std::weak_ptr<Lane> lane, uint64_t submission)
      : Work(std::string(), default_timeout),
        engine_(std::move(engine)),
        lane_(std::move(lane)),
        name_(op.name()),
        label_(label),
        seq_(op.seq()),
        tag_(tag),
        details_(std::move(details)),
        submission_(submission) {}
  // The Work of another submission of an operation that keeps it (only when
  // nothing else references it, completed).
  void rebind(const Operation& op, const std::string& label, int tag, Engine::Details details,
              uint64_t submission) {
    reset(std::string());
    label_ = label;
    seq_ = op.seq();
    tag_ = tag;
    details_ = std::move(details);
    submission_ = submission;
  }
  // Blocks on completion (for drive()'s sleeps).
  bool sleep_until(Clock::time_point deadline) { return block_until(deadline); }
  // Its number among the engine's submissions (from 1).
  uint64_t submission() const { return submission_; }

 protected:
  std::string describe() const override;
  std::string on_timeout(const std::string& reason) override;
  bool await(Clock::time_point deadline) override;
  void on_callback_queued() override;

 private:
  const std::weak_ptr<Engine> engine_;
  const std::weak_ptr<Lane> lane_;
  const std::string name_;
  std::string label_;
  uint64_t seq_;
  int tag_;
  Engine::Details details_;
  uint64_t submission_;
};

}  // namespace relaxcc::engine
