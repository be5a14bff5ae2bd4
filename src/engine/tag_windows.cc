#include "src/engine/tag_windows.h"

#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <sstream>
#include <thread>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "relaxcc/logging.h"
#include "src/engine/clock.h"
#include "src/engine/op_header.h"

namespace relaxcc::engine {

std::vector<uint32_t> TagWindows::reserve(const std::vector<int>& comm_members, size_t me,
                                          uint64_t primary, uint64_t identity,
                                          const std::string& group) {
  std::vector<uint32_t> out(comm_members.size(), 0);
  std::lock_guard<std::mutex> lock(mutex_);
  size_t i = 0;
  try {
    for (; i < comm_members.size(); ++i) {
      if (i == me) continue;
      Pair& pair = pairs_[comm_members[i]];
      if (count_ == 0) {
        // One window for everything: a second group of the pair cannot be told apart.
        RELAXCC_ENFORCE(pair.held.empty(), CommunicationError, group,
                        ": the transport's tags (its max tag) leave one tag window, and another "
                        "group with rank ",
                        comm_members[i], " holds it (live or recently destroyed)");
        pair.held.insert(0);
        continue;
      }
      const uint64_t start = primary % count_;
      // A few windows of the group's own probe sequence, then every window in turn.
      constexpr uint64_t kHashedProbes = 8;
      uint32_t chosen = 0;
      for (uint64_t j = 0; j < kHashedProbes + count_ && chosen == 0; ++j) {
        const uint64_t k = j == 0              ? start
                           : j < kHashedProbes ? Fnv1a().u64(identity).u64(j).value() % count_
                                               : (start + (j - kHashedProbes)) % count_;
        const auto w = static_cast<uint32_t>(1 + k);
        if (pair.held.count(w) == 0) chosen = w;
      }
      if (chosen == 0 && !pair.retired.empty()) {
        // Every window held: the oldest retired one goes first.
        chosen = pair.retired.front().window;
        drain(comm_members[i], pair.retired.front());
        pair.retired.pop_front();
        pair.held.erase(chosen);
      }
      RELAXCC_ENFORCE(
          chosen != 0, CommunicationError, group, ": all ", count_,
          " tag windows shared with rank ", comm_members[i],
          " are held by live groups (the transport's max tag limits them): destroy some first");
      out[i] = chosen;
      pair.held.insert(chosen);
    }
  } catch (...) {
    // Nothing stays reserved for a group that is not made.
    for (size_t k = 0; k < i; ++k) {
      if (k == me) continue;
      auto it = pairs_.find(comm_members[k]);
      it->second.held.erase(out[k]);
      if (it->second.held.empty()) pairs_.erase(it);
    }
    if (auto it = pairs_.find(comm_members[i]); it != pairs_.end() && it->second.held.empty())
      pairs_.erase(it);
    throw;
  }
  return out;
}

void TagWindows::retire(const std::vector<int>& comm_members, size_t me,
                        const std::vector<uint32_t>& windows, uint64_t seq_end, bool failed,
                        bool drain_now) {
  const uint64_t seq_begin = !failed                  ? seq_end
                             : seq_end > kDrainBehind ? seq_end - kDrainBehind
                                                      : 1;
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < comm_members.size() && i < windows.size(); ++i) {
    if (i == me) continue;
    auto it = pairs_.find(comm_members[i]);
    if (it == pairs_.end()) continue;
    Pair& pair = it->second;
    if (count_ == 0) {
      pair.held.clear();  // nothing to keep apart
    } else {
      pair.retired.push_back(Retired{windows[i], seq_begin, seq_end});
      if (drain_now) drain(comm_members[i], pair.retired.back());
      while (pair.retired.size() > kRetired) {
        drain(comm_members[i], pair.retired.front());
        pair.held.erase(pair.retired.front().window);
        pair.retired.pop_front();
      }
    }
    if (pair.held.empty()) pairs_.erase(it);
  }
}

void TagWindows::drain(int peer, const Retired& r) {
  Transport& transport = endpoints_.transport();
  if (transport.closed()) return;
  // No lane receives on these tags from `peer` (the window is nobody's), so
  // this thread may take them off the transport. Queued messages are
  // received at once; a large one whose data has not come within
  // kDrainWait is left to complete into a buffer kept for it.
  constexpr auto kDrainWait = std::chrono::milliseconds(50);
  for (uint64_t seq = r.seq_begin; seq < r.seq_end + kDrainAhead; ++seq) {
    for (int c = 0; c < kTagChannels; ++c) {
      const int tag = collective_tag(r.window, seq, static_cast<Channel>(c), max_tag_);
      for (;;) {
        Message message{};
        size_t bytes = 0;
        Request request{};
        std::unique_ptr<std::vector<unsigned char>> buffer;
        try {
          if (!endpoints_.improbe(Space::collective, peer, tag, &message, &bytes)) break;
          buffer = std::make_unique<std::vector<unsigned char>>(std::max<size_t>(bytes, 1));
          request = endpoints_.imrecv(buffer->data(), bytes, &message);
        } catch (const CommunicationError&) {
          break;
        }
        const auto deadline = Clock::now() + kDrainWait;
        Completion completion;
        int failure = 0;
        bool done = false;
        while (!(done = transport.test(request, completion, failure)) && failure == 0 &&
               Clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        if (!done) {
          RELAXCC_LOG(warn, "a late message of a destroyed group did not arrive within ",
                      kDrainWait.count(), " ms; its buffer is kept (leaked)");
          transport.detach(request);
          buffer.release();  // intentional leak: the transport may still write it
        }
      }
    }
  }
}

TagWindows::Counts TagWindows::counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Counts c;
  for (const auto& [peer, pair] : pairs_) {
    c.retired += pair.retired.size();
    c.live += pair.held.size() - pair.retired.size();
  }
  return c;
}

EndpointSet::EndpointSet(std::shared_ptr<Endpoints> eps)
    : endpoints(std::move(eps)), size(endpoints->size()), max_tag(endpoints->max_tag()) {
  windows = std::make_unique<TagWindows>(*endpoints);
}

}  // namespace relaxcc::engine
