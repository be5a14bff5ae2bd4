// ComputeThread: the engine's thread for RequestPoster::compute's functions.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace relaxcc::engine {

class Operation;

// The engine's compute thread: runs RequestPoster::compute's functions in order
// and hands each result to `done` (which rings the engine's doorbell).
// Started with the first function.
class ComputeThread {
 public:
  using Done = std::function<void(Operation*, int64_t, std::exception_ptr)>;
  explicit ComputeThread(Done done) : done_(std::move(done)) {}
  ~ComputeThread();
  ComputeThread(const ComputeThread&) = delete;
  ComputeThread& operator=(const ComputeThread&) = delete;
  void submit(Operation* op, int64_t slot, std::function<void()> fn);

 private:
  struct Task {
    Operation* op;
    int64_t slot;
    std::function<void()> fn;
  };
  void loop();
  Done done_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace relaxcc::engine
