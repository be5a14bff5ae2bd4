// Operation: a resumable operation of the engine, run by the progress
// token's holder.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "relaxcc/work.h"
#include "src/engine/clock.h"
#include "src/engine/transport.h"

namespace relaxcc::engine {

class EngineWork;
class Lane;
class RequestPoster;
struct DirectExchange;

// A resumable operation. Every method runs on the thread that holds the
// engine's progress token (the engine thread or a waiting caller).
class Operation {
 public:
  Operation(std::string name, int priority) : name_(std::move(name)), priority_(priority) {}
  // Releases the operation's sequence number (and so its tags) in its lane.
  virtual ~Operation() { release_seq(); }

  // Posts the first requests. Called once: in submission order, or once the
  // Work it runs after completed.
  virtual void start(RequestPoster& t) = 0;
  // Called instead of start() when the Work it runs after failed with
  // `error`: fail, telling the peers where the protocol allows. The default
  // aborts without starting (the peers see their own timeout).
  virtual void start_failed(RequestPoster& t, std::exception_ptr error) {
    abort(t, std::move(error));
  }
  // Posts whatever can be posted now. Called every engine iteration.
  virtual void progress(RequestPoster&) {}
  // RequestPoster::compute's function for `slot` returned (error: what it threw).
  virtual void on_computed(RequestPoster&, int64_t /*slot*/, std::exception_ptr /*error*/) {}
  // Request `slot` completed (completion.error: 0, or the transport's code,
  // RequestPoster::error_string).
  virtual void on_complete(RequestPoster& t, int64_t slot, const Completion& completion) = 0;
  // Stop: post nothing new, tell peers that wait on this rank, drain.
  // The first error wins; later ones are ignored.
  virtual void abort(RequestPoster& t, std::exception_ptr error) = 0;
  // The operation finished its protocol (pending requests aside).
  virtual bool done() const = 0;
  // Collective operations take the communicator's next sequence number
  // (their tags derive from it), so every rank numbers them alike.
  // Point-to-point operations involve only some ranks and count separately.
  virtual bool collective() const { return true; }
  // Which peers it still waits for ("rank 3: data 2/8"), for the stall
  // inspector and timeout messages.
  virtual std::string waiting_for() const { return {}; }
  // A background operation (RequestPoster::spawn: a sweeper) keeps the engine
  // looking only about every millisecond: while it has no request pending,
  // the engine counts as idle and calls its progress() at that rate.
  // Shutdown does not wait for it.
  virtual bool background() const { return false; }
  // Before the Work completes: records what the Work reports beyond success
  // (Work::set_contributions).
  virtual void report(Work&) const {}
  // The call's OpOptions::agree and agree_what, set at every submission
  // (Engine::submit, run_now) before the operation starts: an operation that
  // exchanges headers (EdgeOp) carries the value in them and fails with
  // PeerMismatch naming `what` when a peer's differs; others ignore it.
  virtual void set_agreement(uint64_t /*value*/, const std::string& /*what*/) {}
  // The direct path of Engine::run_now, for an operation that exchanges a
  // few messages with one peer. begin_direct() does what start() would, but
  // posts with RequestPoster::post_isend/post_irecv into `x`; it returns false,
  // having done nothing, when the operation has no direct path (start()
  // then). Each time every receive of `x` completed and something moved
  // since the last call, continue_direct() either completes the operation
  // (finished: only once every send completed too), or posts further
  // receives into `x` and marks the completions it took as consumed, or
  // waits for its sends (more), or, when a message is not the one a
  // successful call receives (a mismatch, an abort, a short message),
  // changes nothing and refuses. The engine then hands the requests to the
  // protocol (pending ones to its table, completions not consumed to
  // on_complete), after leave_direct() brought the operation's state to
  // what the protocol expects of the consumed completions and the receives
  // posted. An operation that took a completion must not refuse.
  enum class DirectStep { finished, more, refused };
  virtual bool begin_direct(RequestPoster&, DirectExchange&) { return false; }
  virtual DirectStep continue_direct(RequestPoster&, DirectExchange&) {
    return DirectStep::refused;
  }
  virtual void leave_direct(RequestPoster&) {}

  // A local step the operation needs before start() (a copy of its input
  // into its output, say); runs on the token holder, not before
  // start_failed(). The communicator runs such steps itself, at the call,
  // for operations that start at once.
  void set_prologue(std::function<void()> prologue) { prologue_ = std::move(prologue); }

  const std::string& name() const { return name_; }
  int priority() const { return priority_; }
  uint64_t seq() const { return seq_; }
  int pending() const { return pending_; }
  std::exception_ptr error() const { return error_; }

 protected:
  // Makes an operation the engine dropped (retired, or never submitted)
  // ready for another submission, with `priority`: the engine's state of it
  // starts afresh. Subclasses reset their own state besides.
  void reset_for_reuse(int priority);
  // Records the first error. Returns true if this call recorded it.
  bool set_error(std::exception_ptr e) {
    if (error_) return false;
    error_ = std::move(e);
    return true;
  }
  std::string name_;

 private:
  friend class Engine;
  friend class RequestPoster;
  // Releases its sequence number in its lane (once the engine dropped it).
  void release_seq();
  int priority_;
  uint64_t seq_ = 0;
  int pending_ = 0;
  int computing_ = 0;  // RequestPoster::compute calls not returned to on_computed yet
  std::exception_ptr error_;
  Clock::time_point submitted_;
  Clock::time_point started_;
  bool stall_reported_ = false;
  bool work_completed_ = false;
  std::shared_ptr<EngineWork> work_;
  std::shared_ptr<Lane> lane_;
  bool in_flight_ = false;  // its seq is in lane_->in_flight_
  // Submitted to run after this Work; reset when the operation starts.
  WorkPtr after_;
  std::function<void()> prologue_;
  // Set (by after_'s completion callback, any thread) once after_ completed.
  std::atomic<bool> released_{false};
};

}  // namespace relaxcc::engine
