#include "relaxcc/work_chain.h"

#include <condition_variable>
#include <mutex>
#include <thread>

#include "relaxcc/errors.h"

namespace relaxcc {

namespace {

class ChainWork final : public Work {
 public:
  ChainWork(std::vector<std::function<WorkPtr()>> stages, std::chrono::milliseconds stage_timeout,
            std::string description)
      : description_(std::move(description)) {
    thread_ = std::thread([this, stages = std::move(stages), stage_timeout] {
      std::exception_ptr error;
      try {
        for (const auto& stage : stages)
          if (WorkPtr w = stage()) w->wait(stage_timeout);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = error;
      done_ = true;
      cv_.notify_all();
    });
  }
  ~ChainWork() override { thread_.join(); }

  bool is_completed() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }
  void wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (timeout.count() < 0) {
      cv_.wait(lock, [this] { return done_; });  // every stage has its own timeout
    } else if (!cv_.wait_for(lock, timeout, [this] { return done_; })) {
      RELAXCC_THROW(Timeout, description_, " did not complete within ", timeout.count(), " ms");
    }
    if (error_) std::rethrow_exception(error_);
  }
  std::exception_ptr exception() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }
  void block_stream(void* stream) override {
    RELAXCC_ENFORCE(stream == nullptr, Unsupported, description_, ": block_stream on a host operation");
  }
  std::string description() const override { return description_; }

 private:
  const std::string description_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace

WorkPtr chain_works(std::vector<std::function<WorkPtr()>> stages, std::chrono::milliseconds stage_timeout,
                    std::string description) {
  return std::make_shared<ChainWork>(std::move(stages), stage_timeout, std::move(description));
}

}  // namespace relaxcc
