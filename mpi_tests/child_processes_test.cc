// The collection of child processes (child_processes.h) that the store, UCX,
// detection and membership tests rely on: bounded, and not fooled by signals.
// Not an MPI program.
#include "child_processes.h"

#include <gtest/gtest-spi.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace relaxcc::test {
namespace {

using namespace std::chrono_literals;

// A child that closes its output at once and then keeps running: collection
// fails the test, kills it and reaps it at the bound, not when it would have
// exited (60 s later).
TEST(CollectChildren, AChildThatClosesItsOutputButRunsOnIsKilledAtTheBound) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ChildRun c;
  c.pid = ::fork();
  if (c.pid == 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    ::sleep(60);
    ::_exit(0);
  }
  ::close(fds[1]);
  c.out = fds[0];
  std::vector<ChildRun> runs{c};
  ::testing::TestPartResultArray failures;
  const auto start = std::chrono::steady_clock::now();
  {
    ::testing::ScopedFakeTestPartResultReporter intercept(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    collect_children(runs, 300ms);
  }
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(failures.size(), 1);
  EXPECT_NE(std::string(failures.GetTestPartResult(0).message()).find("closed its output"),
            std::string::npos)
      << failures.GetTestPartResult(0).message();
  EXPECT_LT(took, 5s);
  EXPECT_TRUE(WIFSIGNALED(runs[0].status) && WTERMSIG(runs[0].status) == SIGKILL)
      << "status " << runs[0].status;
  EXPECT_EQ(::waitpid(runs[0].pid, nullptr, WNOHANG), -1) << "not reaped";
}

void on_signal(int) {}

// Signals that interrupt the collection's waits (a handler installed without
// SA_RESTART, raised on the collecting thread every 2 ms) are no timeout:
// the child, which answers after 300 ms, is collected whole, with no failure.
TEST(CollectChildren, InterruptedWaitsResume) {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: poll, read and waitpid fail with EINTR
  struct sigaction previous {};
  ASSERT_EQ(::sigaction(SIGUSR1, &action, &previous), 0);
  std::vector<ChildRun> runs{fork_child([] {
    std::this_thread::sleep_for(300ms);
    return std::string("answer");
  })};
  const pthread_t collector = ::pthread_self();
  std::atomic<bool> done{false};
  std::atomic<int> raised{0};
  std::thread interrupter([&] {
    while (!done.load()) {
      ::pthread_kill(collector, SIGUSR1);
      raised.fetch_add(1);
      std::this_thread::sleep_for(2ms);
    }
  });
  ::testing::TestPartResultArray failures;
  {
    ::testing::ScopedFakeTestPartResultReporter intercept(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    collect_children(runs, 10s);
  }
  done.store(true);
  interrupter.join();
  ::sigaction(SIGUSR1, &previous, nullptr);
  EXPECT_EQ(failures.size(), 0) << (failures.size() > 0 ? failures.GetTestPartResult(0).message()
                                                        : "");
  EXPECT_GT(raised.load(), 50);
  EXPECT_EQ(runs[0].text, "answer");
  EXPECT_TRUE(WIFEXITED(runs[0].status) && WEXITSTATUS(runs[0].status) == 0)
      << "status " << runs[0].status;
}

}  // namespace
}  // namespace relaxcc::test
