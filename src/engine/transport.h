// Transport and Endpoints: the seam between the engine (its lanes, operations
// and protocols) and a wing that moves bytes (MPI in src/mpi, UCX in
// src/ucx). The engine calls nothing else of a wing; a wing's factory builds
// a Transport and its Endpoints and hands them to the engine's communicator.
//
// Model. An endpoint set (Endpoints; MPI: a pair of duplicated communicators)
// connects ranks 0..size()-1, this process being rank(). Messages are tagged,
// in two tag spaces that never match each other: Space::collective (relaxcc's
// own tags: headers, segments, poison notices) and Space::point_to_point
// (users' tags, Communicator::point_to_point). Tags run 0..max_tag(). Within
// one space, messages between two ranks with one tag are matched in the
// order they were posted (MPI's non-overtaking rule); a receive takes a
// message of at most its size (a larger one is a truncation error).
//
// Requests. Posting returns a Request: an opaque, trivially copyable value
// that the engine keeps in its own contiguous array and hands back to the
// transport to test, cancel or detach. A request is complete exactly once:
// test_some() or test() reports it done (and sets it to null_request()), and
// nothing else is done with it afterwards. Buffers stay the caller's and must
// stay valid until their request completed (or, after detach(), for good).
//
// Threads. One thread at a time calls test_some() for a Transport (the
// engine's progress token); every other call may come from any thread
// (a destroyed group's tag windows are drained on the destroying thread).
// Errors of posting throw CommunicationError (PeerLost when the transport
// names the peer); errors of a request are reported in its Completion.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/engine/clock.h"
#include "src/engine/liveness_channel.h"

namespace relaxcc::engine {

class Transport;

// The value types below are trivial (no default member initializers), so
// that arrays of them cost nothing until used: `{}` gives zeros.

// A posted send or receive: the transport's own handle, bit-copied.
struct Request {
  std::uintptr_t bits;
  friend bool operator==(Request, Request) = default;
};

// A message found by Endpoints::improbe, to receive with Endpoints::imrecv
// (once). Opaque, like Request.
struct Message {
  std::uintptr_t bits;
};

// The two tag spaces of an endpoint set.
enum class Space : uint8_t { collective, point_to_point };

// Endpoints::irecv from whichever rank sends first.
inline constexpr int kAnySource = -1;

// What a finished request reports. `source` and `bytes` mean something for
// receives only (sends: unspecified).
struct Completion {
  int source;      // the sender's rank
  size_t bytes;    // bytes received
  bool cancelled;  // a receive that cancel() stopped before it matched
  // 0: success. Otherwise the transport's code: Transport::error_string()
  // says what it means; the peer concerned is the request's peer (the
  // engine knows whom it posted to) or `source` for an any-source receive.
  int error;
};

// A peer the transport gave up on (its process ended, its connection
// closed, it stopped answering), for the endpoint set it belongs to.
struct PeerError {
  const void* endpoints = nullptr;  // the Endpoints concerned (identity only)
  int rank = -1;                    // the peer's rank in that endpoint set
  std::string reason;
};

// One endpoint set. Created by a wing's factory; the engine shares it among
// the lanes of a communicator and its groups and destroys it with the last
// of them (the wing frees what it holds, unless its transport is closed()).
class Endpoints {
 public:
  Endpoints(std::shared_ptr<Transport> transport, int rank, int size, int max_tag)
      : transport_(std::move(transport)),
        rank_(rank),
        size_(size),
        max_tag_(max_tag),
        heard_(std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(size))) {}
  virtual ~Endpoints() = default;
  Endpoints(const Endpoints&) = delete;
  Endpoints& operator=(const Endpoints&) = delete;

  Transport& transport() const { return *transport_; }
  const std::shared_ptr<Transport>& transport_ptr() const { return transport_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // The largest tag of either space (at least 32767).
  int max_tag() const { return max_tag_; }

  // Non-blocking tagged send of `bytes` at `buf` to rank `peer`. Throws
  // CommunicationError (InvalidArgument for a size the transport cannot
  // carry in one message).
  virtual Request isend(Space space, const void* buf, size_t bytes, int peer, int tag) = 0;
  // Non-blocking tagged receive of at most `bytes` into `buf` from `peer`
  // (or kAnySource). Cancellable (Transport::cancel) until it matched.
  virtual Request irecv(Space space, void* buf, size_t bytes, int peer, int tag) = 0;
  // Matched probe: when a message from `peer` with `tag` is waiting, takes
  // it off the matching queue (no other receive can match it any more),
  // returns true with its handle and size. Does not block; drives the
  // transport's progress, so a message still arriving is found.
  virtual bool improbe(Space space, int peer, int tag, Message* message, size_t* bytes) = 0;
  // Receives the probed `message` into `buf` (at least its size). Not
  // cancellable.
  virtual Request imrecv(void* buf, size_t bytes, Message* message) = 0;
  // Gives up on `rank` (the engine's heartbeats found it silent): its
  // requests fail as far as the wing can make them, and the transport
  // reports a PeerError for it (take_peer_errors), so the engine fails and
  // poisons the lanes with it. This default reports only (MPI: the engine's
  // abort of those lanes then cancels the receives from it; sends to it stay
  // posted); UCX fails its requests at once and closes its endpoint. Any
  // thread.
  virtual void fail_peer(int rank, const std::string& reason);

  // The channel of this set's heartbeats when the wing has one of its own
  // (liveness_channel.h); null: the heartbeats go as tagged messages of the
  // transport. Called once, by the engine's heartbeat of this set.
  virtual std::unique_ptr<LivenessChannel> liveness_channel() { return nullptr; }

  // Evidence of life for the engine's heartbeats (heartbeat.h): the engine
  // counts every receive from `rank` that completed with its data
  // (heard_from, token holder: one relaxed load and store), and the
  // heartbeat takes a change of the count (heard_count) as word from it.
  void heard_from(int rank) {
    std::atomic<uint64_t>& n = heard_[static_cast<size_t>(rank)];
    n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  uint64_t heard_count(int rank) const {
    return heard_[static_cast<size_t>(rank)].load(std::memory_order_relaxed);
  }
  // The creation handshake of this set's communicator (its creator calls
  // creating() before and created() once every rank answered; any thread):
  // while it runs, a peer never heard from is given until shortly before
  // `deadline`, the creation's own timeout (a slow peer is not lost, a stopped
  // one is named before the handshake gives up); after it, the heartbeat
  // times such a peer from then.
  void creating(Clock::time_point deadline) {
    creation_deadline_.store(deadline.time_since_epoch().count(), std::memory_order_relaxed);
  }
  void created() { created_.store(true, std::memory_order_release); }
  bool is_created() const { return created_.load(std::memory_order_acquire); }
  // The deadline given to creating(), or nullopt when none was.
  std::optional<Clock::time_point> creation_deadline() const {
    const Clock::rep d = creation_deadline_.load(std::memory_order_relaxed);
    if (d == 0) return std::nullopt;
    return Clock::time_point(Clock::duration(d));
  }

 private:
  const std::shared_ptr<Transport> transport_;
  const int rank_;
  const int size_;
  const int max_tag_;
  const std::unique_ptr<std::atomic<uint64_t>[]> heard_;  // per rank: receives completed
  std::atomic<Clock::rep> creation_deadline_{0};          // 0: none
  std::atomic<bool> created_{false};
};

// What the engine calls for requests of any of a wing's endpoint sets: one
// per engine (every lane of an engine posts through Endpoints of the same
// Transport; test_some() tests requests of all of them together).
class Transport {
 public:
  explicit Transport(Request null_request) : null_(null_request) {}
  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // The wing's name for messages ("MPI", "UCX").
  virtual const char* name() const = 0;
  // The value of a request slot that holds nothing: test_some() skips such
  // slots and sets finished ones to it. Fixed for the Transport's life.
  Request null_request() const { return null_; }

  // Tests requests[0, n) (null ones skipped) and drives the transport's
  // progress as it does so (MPI's Testsome contract). Returns how many
  // finished, writing their positions to indices[0, k) and their
  // completions to completions[0, k) (both have room for n), and sets each
  // finished slot to null_request(). When the call itself fails (not one
  // request: the transport), returns 0 with `failure` set to the
  // transport's code (error_string()); the requests stay the transport's.
  virtual int test_some(int n, Request* requests, int* indices, Completion* completions,
                        int& failure) = 0;
  // test_some() for one request: true when it finished (`request` is null
  // then and `completion` filled in; a null request is finished, with an
  // empty completion). On a failure of the call itself, returns false with
  // `failure` set.
  virtual bool test(Request& request, Completion& completion, int& failure) = 0;
  // Asks the transport to stop a receive that has not matched: it still
  // completes (test/test_some), with Completion::cancelled when stopped in
  // time. Only irecv's requests; at most once per request. Nothing for a
  // null request.
  virtual void cancel(Request& request) = 0;
  // Gives `request` up: the transport completes it by itself and frees it;
  // its buffer must stay valid (the caller leaks it when the request may
  // never complete). Sets `request` to null. Nothing for a null request.
  virtual void detach(Request& request) = 0;
  // What a nonzero Completion::error or `failure` means.
  virtual std::string error_string(int code) const = 0;
  // Whether the transport is shut down (MPI finalized): no call may be made
  // any more; what is posted stays posted, its buffers leak.
  virtual bool closed() const = 0;
  // Whether the transport's own progress yields the CPU (sched_yield) when
  // a test finds nothing (Open MPI's mpi_yield_when_idle), so a waiting
  // thread on a shared CPU need not yield again.
  virtual bool yields_when_idle() const = 0;
  // Sleeping on the transport's events instead of polling it: event_fd() is
  // a file descriptor that becomes readable when the transport has
  // something for test_some() (-1: not supported, as for MPI: the idle
  // engine then polls with its back-off). arm() prepares the fd for a
  // sleep and returns true, or returns false when events are pending
  // already (test first, do not sleep). Only the token holder calls arm().
  // The engine thread sleeps on it (with its own wake fd) where it would
  // otherwise sleep on its condition variable: idle, watching, and in the
  // back-off sleeps while requests are pending; callers that wait keep
  // their back-off.
  virtual int event_fd() const { return -1; }
  virtual bool arm() { return false; }
  // This process's rank in the job, for trace files (-1: unknown).
  virtual int job_rank() const { return -1; }

  // The peers the transport gave up on since the last call, in the order
  // found: the engine fails the lanes with such a peer (PeerLost) and tells
  // their other members. Any thread may report (report_peer_error); the
  // engine checks peer_errors_pending() each progress iteration (one
  // relaxed load) and takes them then.
  bool peer_errors_pending() const { return peer_errors_pending_.load(std::memory_order_relaxed); }
  std::vector<PeerError> take_peer_errors() {
    std::lock_guard<std::mutex> lock(peer_errors_mutex_);
    peer_errors_pending_.store(false, std::memory_order_relaxed);
    return std::move(peer_errors_);
  }

 protected:
  friend class Endpoints;
  void report_peer_error(PeerError error) {
    std::lock_guard<std::mutex> lock(peer_errors_mutex_);
    peer_errors_.push_back(std::move(error));
    peer_errors_pending_.store(true, std::memory_order_relaxed);
  }

 private:
  const Request null_;
  std::atomic<bool> peer_errors_pending_{false};
  std::mutex peer_errors_mutex_;
  std::vector<PeerError> peer_errors_;
};

inline void Endpoints::fail_peer(int rank, const std::string& reason) {
  transport_->report_peer_error(PeerError{this, rank, reason});
}

}  // namespace relaxcc::engine
