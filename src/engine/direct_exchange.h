// DirectExchange: the requests of Engine::run_now's direct path.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "src/engine/transport.h"

namespace relaxcc::engine {

// The requests of a direct exchange (Operation::begin_direct), posted
// outside the engine's request table, in the order they were posted: this
// rank's messages to one peer, the receive of the peer's header message,
// then any receives continue_direct adds. Each has the slot under which
// on_complete knows it.
struct DirectExchange {
  static constexpr int kMaxRequests = 24;
  struct Entry {
    Request request;
    int64_t slot;
    size_t bytes;
    bool send;
    bool completed;  // tested complete (or failed): the transport released it
    bool consumed;   // continue_direct took it: not for on_complete
    Completion completion;
  };
  int peer = -1;  // lane rank
  // Requests [0, count) are set (the others are not initialized: a small
  // exchange does not pay for clearing them).
  std::array<Entry, kMaxRequests> requests;
  int count = 0;
  void add(Request request, int64_t slot, size_t bytes, bool send) {
    requests.at(static_cast<size_t>(count++)) =
        Entry{request, slot, bytes, send, false, false, Completion{}};
  }
  // Whether every send (sends == true) or every receive completed.
  bool all_completed(bool sends) const {
    for (int k = 0; k < count; ++k)
      if (requests[static_cast<size_t>(k)].send == sends &&
          !requests[static_cast<size_t>(k)].completed)
        return false;
    return true;
  }
  // Bytes received by completed receive `k`.
  size_t received(int k) const { return requests[static_cast<size_t>(k)].completion.bytes; }
};

}  // namespace relaxcc::engine
