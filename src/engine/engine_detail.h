// Shared by the engine's sources only (engine.cc, operation.cc,
// direct_exchange.cc, request_table.cc, poison_notices.cc, lane.cc): the
// intervals of the progress loop and the progress token's hold.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>

#include "src/engine/clock.h"

namespace relaxcc::engine {

// How long an idle engine keeps pushing out its own poison notices.
constexpr auto kNoticeSendLimit = std::chrono::seconds(10);
// How long a released endpoint set waits for its peers' answers to its
// leaving beat (at most a peer timeout; Engine::releasing_).
constexpr auto kMaxReleaseWait = std::chrono::seconds(10);
// How often poison notices are looked for.
constexpr auto kNoticePoll = std::chrono::milliseconds(1);
// How often an idle engine thread looks for the peers' poison notices.
constexpr auto kIdleNoticePoll = std::chrono::milliseconds(50);
// How often background operations are polled while they have nothing pending.
constexpr auto kBackgroundPoll = std::chrono::milliseconds(1);
// The engine thread, with nothing to do, wakes this often to pick up what no
// caller drives, for kWatchFor after the last submission (then it sleeps
// until rung).
constexpr auto kWatchInterval = std::chrono::milliseconds(1);
constexpr auto kWatchFor = std::chrono::milliseconds(100);
// Longest back-off sleep while only parked requests remain (operations whose
// Work completed: nobody waits for them).
constexpr int64_t kParkedSleepUs = 1000;

// Progress tokens (of any engine) the calling thread holds.
inline thread_local int tokens_held = 0;

// Holds the progress token: records the holder, releases on scope exit.
class TokenHold {
 public:
  TokenHold(std::mutex& token, std::atomic<std::thread::id>& holder)
      : token_(token), holder_(holder), held_(token.try_lock()) {
    if (!held_) return;
    holder_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    ++tokens_held;
  }
  ~TokenHold() {
    if (!held_) return;
    --tokens_held;
    holder_.store(std::thread::id(), std::memory_order_relaxed);
    token_.unlock();
  }
  TokenHold(const TokenHold&) = delete;
  TokenHold& operator=(const TokenHold&) = delete;
  explicit operator bool() const { return held_; }

 private:
  std::mutex& token_;
  std::atomic<std::thread::id>& holder_;
  const bool held_;
};

inline int64_t micros(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

}  // namespace relaxcc::engine
