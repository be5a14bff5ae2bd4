#include "src/engine/compute_thread.h"

#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <sstream>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "relaxcc/logging.h"

namespace relaxcc::engine {

ComputeThread::~ComputeThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ComputeThread::submit(Operation* op, int64_t slot, std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(Task{op, slot, std::move(fn)});
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  cv_.notify_one();
}

void ComputeThread::loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (stop_) return;  // the engine is gone: nobody waits for the rest
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    std::exception_ptr error;
    try {
      task.fn();
    } catch (...) {
      error = std::current_exception();
    }
    done_(task.op, task.slot, std::move(error));
  }
}

}  // namespace relaxcc::engine
