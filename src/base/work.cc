#include "relaxcc/work.h"

#include <sched.h>

#include "relaxcc/errors.h"
#include "relaxcc/logging.h"
#include "relaxcc/tunables.h"

namespace relaxcc {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

namespace detail {
// The Work then() returns: completes when the callback returned. An expiring
// wait() on it poisons what its parent's would (the parent is what is late).
class ThenWork final : public Work {
 public:
  ThenWork(std::string description, std::weak_ptr<Work> parent)
      : Work(std::move(description)), parent_(std::move(parent)) {}

 protected:
  std::string on_timeout(const std::string& reason) override;

 private:
  std::weak_ptr<Work> parent_;
};

// when_all's result.
class AllWork final : public Work {
 public:
  AllWork(std::string description, std::vector<WorkPtr> works, std::function<void(Work&)> finish)
      : Work(std::move(description)), works_(std::move(works)), finish_(std::move(finish)) {}

  // Registers the callbacks (after construction: they hold a reference).
  void arm(const std::shared_ptr<AllWork>& self) {
    remaining_.store(static_cast<int>(works_.size()) + 1);
    for (const WorkPtr& w : works_) w->then([self](const Work&) { self->one_done(); });
    one_done();
  }

 protected:
  std::string on_timeout(const std::string& reason) override {
    for (const WorkPtr& w : works_)
      if (!w->is_completed()) return w->on_timeout(reason);
    return {};
  }

 private:
  void one_done() {
    if (remaining_.fetch_sub(1) != 1) return;
    std::exception_ptr error;
    for (const WorkPtr& w : works_)
      if ((error = w->exception())) break;
    if (!error && finish_) {
      try {
        finish_(*this);
      } catch (...) {
        error = std::current_exception();
      }
    }
    finish_ = nullptr;
    complete(std::move(error));
  }

  std::vector<WorkPtr> works_;
  std::function<void(Work&)> finish_;
  std::atomic<int> remaining_{0};
};

}  // namespace detail

Work::Work(std::string description, std::chrono::milliseconds default_timeout,
           std::chrono::microseconds spin)
    : description_(std::move(description)),
      default_timeout_(default_timeout.count() >= 0
                           ? default_timeout
                           : std::chrono::milliseconds(Tunables{}.timeout_ms)),
      spin_(spin),
      created_(Clock::now()) {}

std::exception_ptr Work::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

void Work::set_contributions(std::vector<int> contributors, std::vector<int> missing) {
  std::lock_guard<std::mutex> lock(mutex_);
  contributors_ = std::move(contributors);
  missing_ = std::move(missing);
}

std::vector<int> Work::contributors() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return contributors_;
}

std::vector<int> Work::missing_peers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return missing_;
}

bool Work::partial() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !missing_.empty();
}

void Work::complete(std::exception_ptr error) {
  std::vector<Callback> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_.load(std::memory_order_relaxed)) return;
    error_ = std::move(error);
    done_.store(true, std::memory_order_release);
    callbacks.swap(callbacks_);
  }
  cv_.notify_all();
  for (auto& callback : callbacks) callback(*this);
}

bool Work::wait_for(std::chrono::milliseconds timeout) {
  if (spin_.count() > 0 && timeout.count() > 0) {
    const auto spin_until = Clock::now() + spin_;
    while (!is_completed() && Clock::now() < spin_until) sched_yield();
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_for(lock, std::max(timeout, std::chrono::milliseconds(0)),
                    [this] { return done_.load(std::memory_order_relaxed); }))
    return false;
  if (error_) std::rethrow_exception(error_);
  return true;
}

void Work::wait(std::chrono::milliseconds timeout) {
  if (timeout.count() < 0) timeout = default_timeout_;
  if (wait_for(timeout)) return;
  const auto elapsed =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - created_);
  const std::string state = on_timeout(detail::concat("timeout of ", description_));
  RELAXCC_THROW(Timeout, description_, " did not complete within ", timeout.count(),
                " ms (elapsed ", elapsed.count(), " ms since it was posted); ",
                state.empty() ? "" : state + "; ", "the communicator is now poisoned");
}

WorkPtr Work::then(Callback callback, std::string description) {
  auto next = std::make_shared<detail::ThenWork>(
      description.empty() ? detail::concat(description_, " then") : std::move(description),
      weak_from_this());
  Callback run = [next, callback = std::move(callback)](const Work& done) {
    std::exception_ptr error = done.exception();
    try {
      callback(done);
    } catch (...) {
      error = std::current_exception();
    }
    next->complete(std::move(error));
  };
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!done_.load(std::memory_order_relaxed)) {
      callbacks_.push_back(std::move(run));
      return next;
    }
  }
  run(*this);
  return next;
}

WorkPtr when_all(std::vector<WorkPtr> works, std::function<void(Work& result)> finish,
                 std::string description) {
  auto all = std::make_shared<detail::AllWork>(std::move(description), std::move(works),
                                               std::move(finish));
  all->arm(all);
  return all;
}

void Work::block_stream(void* stream) {
  RELAXCC_ENFORCE(stream == nullptr, Unsupported, description_,
                  ": block_stream on a host operation (call wait())");
}

std::string Work::on_timeout(const std::string&) {
  return {};
}

std::string detail::ThenWork::on_timeout(const std::string& reason) {
  auto parent = parent_.lock();
  return parent ? parent->on_timeout(reason) : std::string();
}

}  // namespace relaxcc
