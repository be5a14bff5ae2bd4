// Child processes of the test programs that start ranks themselves (store,
// UCX and detection tests): runs of this program in a mode of its own with an
// environment of the test's choosing, forked worlds that exchange their
// address blobs through files, and their collection with timeouts.
#pragma once

#include <errno.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace relaxcc::test {

// A run of this program as a child: its pid, the pipe of its standard output,
// what it wrote there and its wait status, once collected.
struct ChildRun {
  pid_t pid = -1;
  int out = -1;
  std::string text;
  int status = -1;
};

// Starts /proc/self/exe with `mode` as its only argument, in this process's
// environment less the variables named in `controlled`, plus `vars`.
inline ChildRun spawn_child(const char* mode, const std::map<std::string, std::string>& vars,
                            const std::vector<std::string>& controlled) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (std::find(controlled.begin(), controlled.end(), name) == controlled.end())
      env.push_back(entry);
  }
  for (const auto& [k, v] : vars) env.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  ChildRun c;
  c.pid = ::fork();
  if (c.pid == 0) {
    ::dup2(fds[1], 1);
    ::close(fds[0]);
    ::close(fds[1]);
    char self[] = "/proc/self/exe";
    std::string flag = mode;
    char* argv[] = {self, flag.data(), nullptr};
    ::execve(self, argv, envp.data());
    std::_Exit(127);
  }
  ::close(fds[1]);
  c.out = fds[0];
  return c;
}

// Forks a child that runs `body` and writes what it returns (or the message
// of what it throws) to its pipe, then exits 0 when that write succeeded, 1
// otherwise. collect_children() reads it.
inline ChildRun fork_child(const std::function<std::string()>& body) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  ChildRun c;
  c.pid = ::fork();
  if (c.pid == 0) {
    ::close(fds[0]);
    std::string result;
    try {
      result = body();
    } catch (const std::exception& e) {
      result = e.what();
    }
    const ssize_t n = ::write(fds[1], result.data(), result.size());
    ::_exit(n == static_cast<ssize_t>(result.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  c.out = fds[0];
  return c;
}

// Reads each child's output until it closes and reaps the child, all within
// `timeout`: a child still running then (its output open, or closed but the
// child not exited) is killed, reaped, and is a test failure. A signal that
// interrupts a wait (EINTR) is no timeout: the wait resumes.
inline void collect_children(const std::vector<ChildRun*>& runs,
                             std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto left_ms = [&] {
    return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(
                                    deadline - std::chrono::steady_clock::now())
                                    .count());
  };
  for (ChildRun* c : runs) {
    bool running = true;  // not known to have exited
    for (;;) {
      pollfd p{c->out, POLLIN, 0};
      const int64_t left = left_ms();
      const int ready = left > 0 ? ::poll(&p, 1, static_cast<int>(left)) : 0;
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) {
        ::kill(c->pid, SIGKILL);
        ADD_FAILURE() << "child " << c->pid << " still running after " << timeout.count() << " ms"
                      << (ready < 0 ? std::string(" (poll: ") + std::strerror(errno) + ")" : "");
        running = false;  // killed: reaped below
        break;
      }
      char buf[4096];
      const ssize_t n = ::read(c->out, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      c->text.append(buf, static_cast<size_t>(n));
    }
    ::close(c->out);
    c->out = -1;
    // Its output closed: it should exit at once; killed if not by the deadline.
    while (running) {
      const pid_t got = ::waitpid(c->pid, &c->status, WNOHANG);
      if (got < 0 && errno == EINTR) continue;
      if (got != 0) break;  // reaped (or not ours: nothing to wait for)
      if (left_ms() == 0) {
        ::kill(c->pid, SIGKILL);
        ADD_FAILURE() << "child " << c->pid << " closed its output but was still running after "
                      << timeout.count() << " ms";
        running = false;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    // Killed: SIGKILL ends it, so this wait is short.
    if (!running)
      while (::waitpid(c->pid, &c->status, 0) < 0 && errno == EINTR) {
      }
  }
}

inline void collect_children(std::vector<ChildRun>& runs, std::chrono::milliseconds timeout) {
  std::vector<ChildRun*> each;
  for (ChildRun& c : runs) each.push_back(&c);
  collect_children(each, timeout);
}

// Forked ranks (`pids`, by rank) that ran a test body: waits for each to exit
// within `timeout` and EXPECTs exit code 0, except for the ranks in `exempt`
// (killed or stopped by the test), which are neither waited for nor checked.
// Reaped pids become -1.
inline void join_children(std::vector<pid_t>& pids, std::chrono::milliseconds timeout,
                          const std::vector<int>& exempt = {}) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (size_t r = 0; r < pids.size(); ++r) {
    if (std::find(exempt.begin(), exempt.end(), static_cast<int>(r)) != exempt.end()) continue;
    int status = 0;
    pid_t got = 0;
    for (;;) {
      got = waitpid(pids[r], &status, WNOHANG);
      if (got < 0 && errno == EINTR) continue;
      if (got != 0 || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (got == 0) {
      ADD_FAILURE() << "rank " << r << " did not finish in time";
      continue;
    }
    pids[r] = -1;
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "rank " << r << " failed (status " << status << ")";
  }
}

// Kills and reaps the forked ranks still in `pids` (a test's teardown).
inline void kill_children(std::vector<pid_t>& pids) {
  for (pid_t pid : pids)
    if (pid > 0) ::kill(pid, SIGKILL);
  for (pid_t& pid : pids)
    if (pid > 0)
      while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
}

// The forked ranks' address blobs, exchanged through files of a temporary
// directory (removed with this object): publish() writes rank r's at once,
// read() waits for it.
class BlobDirectory {
 public:
  explicit BlobDirectory(const std::string& prefix) {
    std::string tmpl = "/tmp/" + prefix + ".XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
  }
  ~BlobDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  BlobDirectory(const BlobDirectory&) = delete;
  BlobDirectory& operator=(const BlobDirectory&) = delete;

  template <typename Bytes>
  void publish(int rank, const Bytes& blob) const {
    const std::string path = path_of(rank);
    {
      std::ofstream out(path + ".tmp", std::ios::binary);
      out.write(reinterpret_cast<const char*>(blob.data()),
                static_cast<std::streamsize>(blob.size()));
    }
    std::filesystem::rename(path + ".tmp", path);
  }

  // Rank `rank`'s blob; throws when it is not there within `timeout`.
  std::vector<std::byte> read(int rank, std::chrono::milliseconds timeout) const {
    const std::string path = path_of(rank);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!std::filesystem::exists(path)) {
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("no blob from rank " + std::to_string(rank));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::ifstream in(path, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> blob(bytes.size());
    std::transform(bytes.begin(), bytes.end(), blob.begin(),
                   [](char c) { return static_cast<std::byte>(c); });
    return blob;
  }

 private:
  std::string path_of(int rank) const { return dir_ + "/" + std::to_string(rank); }
  std::string dir_;
};

}  // namespace relaxcc::test
