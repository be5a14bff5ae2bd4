// A fixed-size pool of worker threads for data-parallel host kernels.
//
// Workers sleep on a condition variable when there is no work: they never
// spin, because spinning threads starve MPI progress on small machines.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace relaxcc {

class ThreadPool {
 public:
  // `num_threads` counts the calling thread, which takes part in every
  // parallel_for; 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const noexcept { return static_cast<int>(workers_.size()) + 1; }

  // Splits [0, n) into at most num_threads() ranges of at least `grain`
  // elements and calls fn(begin, end) for each, returning when all are done.
  // The first exception thrown by fn is rethrown here. Calls from several
  // threads at once are serialized.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one parallel_for at a time
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int parts_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
};

}  // namespace relaxcc
