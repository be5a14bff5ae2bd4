// Work: the handle every asynchronous relaxcc call returns.
//
// A Work completes exactly once, with success or with a stored exception.
// wait() blocks with a timeout; is_completed() and exception() never block.
// The Work keeps the operation's buffers alive (the TensorView owners it was
// given and its internal scratch) until the transport has let go of them.
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <string>

namespace relaxcc {

class Work {
 public:
  virtual ~Work() = default;

  // True once the operation finished, successfully or not.
  virtual bool is_completed() const = 0;

  // Waits until the operation finished and rethrows its exception, if any.
  // A negative timeout uses the communicator's default (RELAXCC_TIMEOUT_MS).
  // When the timeout passes first, throws Timeout naming the operation, its
  // sequence number, tag, peers and the elapsed time, and POISONS the
  // communicator the operation runs on (see Communicator).
  virtual void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) = 0;

  // The stored exception of a completed operation; null while pending or on
  // success.
  virtual std::exception_ptr exception() const = 0;

  // Makes work enqueued later on `stream` (a cudaStream_t) wait for this
  // operation, without blocking the host. Host operations accept only a null
  // stream (there is nothing to order) and throw Unsupported otherwise.
  virtual void block_stream(void* stream) = 0;

  // "allreduce #12 (ring, tag 49, peers 1,3)": what this Work is for.
  virtual std::string description() const = 0;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace relaxcc
