// The NCCL communicator's watchdog: the rule by which its progress thread
// ends an operation that nobody waits on. Kept free of CUDA and NCCL so that
// its bookkeeping is tested on machines without a device.
//
// Contract. An operation submitted at `submitted` is overdue once the
// communicator's timeout has passed since then (a zero or negative timeout
// never expires). The progress thread checks the oldest pending operation
// each time it polls (every RELAXCC_MAX_SLEEP_US at most while operations are
// pending): an overdue one completes with Timeout carrying timeout_message(),
// the NCCL communicator is aborted (ncclCommAbort) and this one poisoned with
// poison_reason(), whether or not anybody called wait(). A wait() with a
// longer timeout than the communicator's therefore ends at the watchdog's
// Timeout: the communicator's timeout bounds every operation.
#pragma once

#include <chrono>
#include <string>

#include "relaxcc/errors.h"

namespace relaxcc::nccl {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Watchdog(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  bool enabled() const noexcept { return timeout_.count() > 0; }

  // True once `timeout` passed since `submitted`.
  bool overdue(Clock::time_point submitted, Clock::time_point now) const noexcept {
    return enabled() && now - submitted >= timeout_;
  }

  // "rank 1 (cuda:0): allreduce #7 (nccl, 4096 x f32, 'bucket 3') was still
  // pending 1003 ms after it was submitted (timeout 1000 ms); the watchdog
  // failed it and aborted the NCCL communicator (ncclCommAbort)": the
  // operation, the rank and the device (`who`), for the Timeout.
  std::string timeout_message(const std::string& who, const std::string& op,
                              std::chrono::milliseconds elapsed) const {
    return detail::concat(who, ": ", op, " was still pending ", elapsed.count(),
                          " ms after it was submitted (timeout ", timeout_.count(),
                          " ms); the watchdog failed it and aborted the NCCL communicator "
                          "(ncclCommAbort)");
  }
  // What later calls report (CommunicatorPoisoned: "... poisoned (<reason>)").
  std::string poison_reason(const std::string& op) const {
    return detail::concat("watchdog: ", op, " pending past the timeout of ", timeout_.count(),
                          " ms; ncclCommAbort called");
  }

 private:
  std::chrono::milliseconds timeout_;
};

}  // namespace relaxcc::nccl
