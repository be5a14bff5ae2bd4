#include "relaxcc/work.h"

#include <sched.h>

#include <algorithm>

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
  ThenWork(std::string description, std::chrono::milliseconds default_timeout,
           std::weak_ptr<Work> parent)
      : Work(std::move(description), default_timeout), parent_(std::move(parent)) {}

 protected:
  std::string on_timeout(const std::string& reason) override;
  // Waits on the parent the way the parent's own waiters do (driving its
  // progress), then for the callback, which ran on whichever thread
  // completed the parent.
  bool await(std::chrono::steady_clock::time_point deadline) override;

 private:
  std::weak_ptr<Work> parent_;
};

// when_all's result.
class AllWork final : public Work {
 public:
  AllWork(std::string description, std::vector<WorkPtr> works, std::function<void(Work&)> finish)
      : Work(std::move(description), longest_timeout(works)),
        works_(std::move(works)),
        finish_(std::move(finish)) {}

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
  // Waits on each part the way its own waiters do (driving its progress),
  // then for `finish`, which ran on whichever thread completed the last part.
  bool await(std::chrono::steady_clock::time_point deadline) override {
    for (const WorkPtr& w : works_)
      if (!w->is_completed() && !w->await(deadline)) return false;
    return block_until(deadline);
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

  // The largest default timeout of `works`; negative (the compiled
  // default) when there are none.
  static std::chrono::milliseconds longest_timeout(const std::vector<WorkPtr>& works) {
    std::chrono::milliseconds longest(-1);
    for (const WorkPtr& w : works) longest = std::max(longest, w->default_timeout());
    return longest;
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

const std::string& Work::description() const noexcept {
  if (!described_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!described_.load(std::memory_order_relaxed)) {
      if (description_.empty()) description_ = describe();
      described_.store(true, std::memory_order_release);
    }
  }
  return description_;
}

void Work::reset(std::string description) {
  std::lock_guard<std::mutex> lock(mutex_);
  description_ = std::move(description);
  described_.store(false, std::memory_order_relaxed);
  created_ = Clock::now();
  error_ = nullptr;
  contributors_.clear();
  missing_.clear();
  callbacks_.clear();
  done_.store(false, std::memory_order_release);
}

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
  if (!is_completed()) {
    const auto deadline = Clock::now() + std::max(timeout, std::chrono::milliseconds(0));
    if (spin_.count() > 0 && timeout.count() > 0) {
      const auto spin_until = std::min(deadline, Clock::now() + spin_);
      while (!is_completed() && Clock::now() < spin_until) sched_yield();
    }
    if (!is_completed() && !await(deadline)) return false;
  }
  // error_ no longer changes once done_ is set.
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool Work::await(Clock::time_point deadline) {
  return block_until(deadline);
}

bool Work::block_until(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_until(lock, deadline, [this] { return done_.load(std::memory_order_relaxed); });
}

void Work::wait(std::chrono::milliseconds timeout) {
  if (timeout.count() < 0) timeout = default_timeout_;
  if (wait_for(timeout)) return;
  const auto elapsed =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - created_);
  const std::string state = on_timeout(detail::concat("timeout of ", description()));
  RELAXCC_THROW(Timeout, description(), " did not complete within ", timeout.count(),
                " ms (elapsed ", elapsed.count(), " ms since it was posted); ",
                state.empty() ? "" : state + "; ", "the communicator is now poisoned");
}

WorkPtr Work::then(Callback callback, std::string description) {
  auto next = std::make_shared<detail::ThenWork>(
      description.empty() ? detail::concat(this->description(), " then") : std::move(description),
      default_timeout_, weak_from_this());
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
      lock.unlock();
      on_callback_queued();
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
  if (stream == nullptr) return;
  // Completed: nothing left to order; a failure is the caller's to see.
  RELAXCC_ENFORCE(is_completed(), Unsupported, description(),
                  ": block_stream on a host operation still in flight (call wait())");
  if (std::exception_ptr e = exception()) std::rethrow_exception(e);
}

std::string Work::on_timeout(const std::string&) {
  return {};
}

bool detail::ThenWork::await(Clock::time_point deadline) {
  if (auto parent = parent_.lock(); parent && !parent->is_completed() && !parent->await(deadline))
    return false;
  return block_until(deadline);
}

std::string detail::ThenWork::on_timeout(const std::string& reason) {
  auto parent = parent_.lock();
  return parent ? parent->on_timeout(reason) : std::string();
}

}  // namespace relaxcc
