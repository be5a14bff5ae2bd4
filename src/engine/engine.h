// The communication engine: the progress of every transport call of the
// communicators that share it (a communicator, its splits and groups).
//
// Each communicator is a lane of the engine (Lane): its members (ranks of an
// transport endpoint set), sequence numbers, tags, statistics and poison state.
// Operations of a lane take their order in it; priorities apply across all
// lanes, so a low-priority operation on one communicator posts one segment at
// a time while a higher one on another is active. Operations are
// resumable state machines. Each takes its sequence number (and so its tags)
// when it is submitted; the engine starts it then, or, when it was submitted
// to run after another Work, once that Work completed. It lets them post requests (in priority
// order, so that a large low-priority operation yields the network to a high-priority one), tests
// every pending request with Transport::test_some, and hands completions back to their operation.
//
// Progress token. One progress iteration (iterate()) at a time runs, on the
// thread that holds the engine's token: only that thread tests the
// transport's requests for the engine and touches its operations. A caller blocked in Work::wait on
// one of the engine's Works takes the token itself (drive()) and runs the iterations until its Work
// completed, so a blocking wait needs no thread hand-off (a transport takes calls from any thread).
// The engine thread holds it while nobody waits, and steps aside while callers drive. Nobody blocks
// on the token: it is only ever tried, so releasing it never wakes a thread.
//
// Waking the engine thread costs a futex wake (docs/benchmarks.md), so
// submit() rings it only when it is idle (then it wakes by itself only every
// kIdleNoticePoll, to take the peers' poison notices), or when the last
// operation completed on the engine thread (the caller does not wait: then()
// callbacks, overlap); otherwise the thread watches, waking every
// kWatchInterval, and picks up what no caller drives. Back-off, for the engine
// thread and for waiting callers, after an iteration that moved nothing:
//   own CPUs (Backoff::yield: each rank of the node has a CPU): busy polling
//          for tunables.spin_us, then sched_yield() between polls;
//   shared CPUs (Backoff::sleep): sched_yield() between polls from the first;
// then, once nothing moved for tunables.yield_us (callers; the engine thread
// in shared mode only tunables.spin_us, since it competes with computation),
// sleeps of 4 us doubling to tunables.max_sleep_us (1 ms when only parked
// requests remain). So no thread spins on a shared CPU without yielding, and
// requests that stay pending for long (a late peer, parked sends) are polled
// with sleeps, not yields.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "relaxcc/communicator.h"
#include "relaxcc/tunables.h"
#include "src/collectives/scratch_pool.h"
#include "src/engine/clock.h"
#include "src/engine/compute_thread.h"
#include "src/engine/direct_exchange.h"
#include "src/engine/heartbeat.h"
#include "src/engine/lane.h"
#include "src/engine/op_header.h"
#include "src/engine/operation.h"
#include "src/engine/request_poster.h"
#include "src/engine/tag_windows.h"
#include "src/engine/transport.h"

namespace relaxcc::engine {

class EngineWork;

// How other threads hand the engine thread something to do (new operations,
// released dependencies, stop, poison). Shared with dependency callbacks,
// which may run after the engine is gone.
struct Doorbell {
  std::mutex mutex;
  std::condition_variable cv;
  // Set (under mutex) when the queue, stop, poison or released changed;
  // cleared by the engine thread when it picks them up. Lets the loop skip
  // the mutex.
  std::atomic<bool> signalled{false};
  bool released = false;  // a waiting operation's dependency completed (under mutex)
  // RequestPoster::compute results not handed to their operation yet (under mutex).
  struct Computed {
    Operation* op;
    int64_t slot;
    std::exception_ptr error;
  };
  std::vector<Computed> computed;
  // Callers driving the engine's progress (Engine::drive): they pick up what
  // is rung, so the engine thread need not be woken.
  std::atomic<int> drivers{0};
  // An eventfd the engine thread sleeps on beside the transport's event fd
  // (-1: the transport has none; the thread sleeps on cv). Owned.
  int wake_fd = -1;
  ~Doorbell();
  void ring_released();
  // Wakes whoever sleeps on cv or on wake_fd (after the change, outside mutex).
  void notify();
};

// What a timed-out operation still waited for: filled by the engine thread.
struct TimeoutReport {
  std::mutex mutex;
  std::condition_variable cv;
  bool ready = false;
  std::string waiting;
};

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  // yield: each rank of the node has a CPU of its own (busy polling first);
  // sleep: ranks share CPUs (every poll that finds nothing yields).
  enum class Backoff { sleep, yield };
  // How the engine and its callers wait (RELAXCC_ENGINE_POLL, the node's layout).
  // (When the transport's own progress yields the CPU when it finds nothing,
  // Transport::yields_when_idle, a poll that tested requests needs no
  // sched_yield of its own in sleep mode.)
  struct Polling {
    Backoff backoff = Backoff::sleep;
  };
  // `tunables`: the engine's own (spin, sleep, stall warnings, trace); each
  // lane has its own for its operations. Every lane's endpoints are
  // `transport`'s. Throws InvalidArgument, starting nothing, for tunables
  // that check_tunables (src/engine/tunables_check.h) refuses.
  Engine(Tunables tunables, Polling polling, std::shared_ptr<Transport> transport);
  // Changes the polling (creation learns the node's layout after the engine
  // started).
  void set_polling(Polling polling);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // A lane over `members` (ranks of comms; empty: all of them, in order; its
  // endpoints must be the engine's transport's: InvalidArgument), in
  // which this process is rank `rank`, with tag windows `windows` (see Lane).
  std::shared_ptr<Lane> add_lane(std::shared_ptr<EndpointSet> comms, std::vector<int> members,
                                 int rank, uint32_t id, std::vector<uint32_t> windows,
                                 Tunables tunables);
  // The lane's communicator is gone: its tag windows are retired
  // (TagWindows); operations still in flight get min(RELAXCC_TIMEOUT_MS,
  // 10 s) to finish, then fail and poison the lane.
  void close_lane(const std::shared_ptr<Lane>& lane);

  // What a call's Work description says about it ("ring, 1024 x f32, peers
  // 1,3"), built only when the description is asked for (from any thread).
  using Details = std::function<std::string()>;
  // Enqueues `op` on `lane` with its next sequence number and returns its
  // Work, whose description reads "<name> #<seq> of '<label>' (tag <t>,
  // <details>)" (OpOptions::label; without one, no "of"). With
  // options.after, the operation keeps that place but starts only once that
  // Work completed. Throws CommunicatorPoisoned when the lane is poisoned.
  // The engine must be owned by a shared_ptr (Works hold weak references to
  // it).
  std::shared_ptr<Work> submit(const std::shared_ptr<Lane>& lane, std::shared_ptr<Operation> op,
                               Details details, const OpOptions& options);
  std::shared_ptr<Work> submit(const std::shared_ptr<Lane>& lane, std::shared_ptr<Operation> op,
                               const std::string& details, const OpOptions& options) {
    return submit(lane, std::move(op), Details([details] { return details; }), options);
  }
  // The small-operation path: submits `op` and runs it to completion on the
  // calling thread at once, when the engine is quiet (the caller takes the
  // progress token; no operation is active, waiting or queued and nothing
  // else is signalled; the lane is not poisoned; no options.after; not
  // inside a completion callback). It takes its sequence number as submit()
  // would and runs the same protocol, with no queue round trip and no Work
  // of its own: when it succeeds before tunables.spin_us pass without
  // progress (busy polling on own CPUs, yields on shared ones), returns
  // `done`, a completed Work the caller keeps for such calls. Otherwise (it
  // failed, a peer takes its time, another thread submitted) the operation
  // goes on as if submitted and its own Work is returned. Returns null, having done
  // nothing, when the engine is not quiet: submit() instead. An operation
  // with a direct path (Operation::begin_direct) runs it here, its requests
  // outside the engine's table, and goes back to the protocol for anything
  // but success.
  std::shared_ptr<Work> run_now(const std::shared_ptr<Lane>& lane,
                                const std::shared_ptr<Operation>& op, Details details,
                                const OpOptions& options, const WorkPtr& done);

  // Poisons `lane` (see Communicator): its operations fail, later ones are
  // refused. With `notify_peers` (the poisoning starts on this rank: a
  // timeout, a transport error), every other member of the lane gets a
  // PoisonNotice and poisons its copy of the lane when it arrives: at once
  // when it waits in an operation of the lane, and before it starts its next
  // one otherwise. A member whose part of the failed operation completed
  // before the notice arrived keeps that result; its next call on the lane
  // throws CommunicatorPoisoned. `lost`: the lane rank whose loss poisoned
  // it (-1: none); the operations in flight then fail with PeerLost naming
  // it, on every member (the notice carries it).
  void poison(const std::shared_ptr<Lane>& lane, const std::string& reason,
              bool notify_peers = true, int lost = -1);
  // poison() for a wait on `work` that timed out: the poison reason (and so
  // the peers' notice) names the peers the operation still waited for.
  // Returns them ("waiting for: rank 3 (header)"), or the reason the lane
  // was poisoned already, for the Timeout message (empty if the engine
  // thread did not answer within 200 ms).
  std::string poison_on_timeout(const std::shared_ptr<Lane>& lane, const Work& work,
                                const std::string& reason);
  CommStats stats(const Lane& lane) const;
  // Whether the calling thread holds the progress token (and so may post
  // and test requests for this engine).
  bool on_engine_thread() const { return std::this_thread::get_id() == thread_.get_id(); }
  // Whether the calling thread runs progress iterations of any engine (a
  // completion callback runs inside one).
  static bool drives_progress_here();
  bool holds_token() const {
    return token_holder_.load(std::memory_order_relaxed) == std::this_thread::get_id();
  }
  const Tunables& tunables() const { return tunables_; }

  // Runs progress iterations on the calling thread, taking turns with other
  // drivers, until `work` completed (true) or `deadline` passed (false). A
  // zero wait (deadline now) runs at most one iteration. Called from
  // Work::wait by way of EngineWork::await; on a thread that holds the token
  // already (a completion callback that waits, against the rules) it only
  // blocks.
  bool drive(EngineWork& work, Clock::time_point deadline);
  // A callback was queued on a pending Work: make sure the engine thread runs
  // (nobody may wait on that Work).
  void wake_for_callbacks();

 private:
  friend class RequestPoster;
  struct Pending {
    Operation* op = nullptr;
    int64_t slot = 0;
    size_t bytes = 0;
    int peer = -1;  // lane rank
    bool send = false;
    bool recv = false;
    Clock::time_point posted;
    // A posted receive not cancelled yet. Matched receives (imrecv) are
    // never cancellable, and no request is cancelled twice (Transport::cancel).
    bool cancellable = false;
  };

  // What the engine thread does (State, under mutex_ when it blocks).
  enum class State { idle, watching, running };

  void loop();
  // One progress iteration; the caller holds the token. Returns whether
  // anything moved (an operation arrived or started, a request completed).
  bool iterate(Clock::time_point now);
  // The engine thread's wait while it has nothing to do or callers drive:
  // returns false when it should stop.
  bool wait_for_work();
  // What sleep_on_events() did.
  enum class Slept { unsupported, rung, events };
  // The engine thread's sleep on the transport's event fd and the doorbell's
  // wake_fd, for at most `timeout` (lock held on entry and on return):
  // unsupported when the transport has no event fd or a caller holds the
  // token (sleep on cv instead); rung when the doorbell rang; events when the
  // transport has something for test_some() or the timeout passed.
  Slept sleep_on_events(std::unique_lock<std::mutex>& lock, Clock::duration timeout);
  // Wakes the engine thread unless it runs (under mutex_ or not).
  void wake_engine(bool only_if_idle);
  // Sleep length of the back-off after `sleep_us`: doubling to
  // max_sleep_us, to kParkedSleep when only parked requests remain.
  int64_t next_sleep(int64_t sleep_us) const;
  // The back-off after an iteration that moved nothing, `idle` after the
  // last one that did (`tested`: it called test_some): busy polling (own
  // CPUs, for spin_us), then sched_yield() until `yield_until` (true: poll
  // again), then false: sleep.
  bool pause(Clock::duration idle, bool tested, Clock::duration yield_until) const;
  // submit() and run_now(), under mutex_: `op` takes the lane's next sequence
  // number and `now` as its submission time (throws when the lane is
  // poisoned, shutting down, or its window of sequence numbers in flight is
  // full).
  void take_seq_locked(Lane& lane, Operation& op, Clock::time_point now);
  // Under mutex_: gives `op` its Work for submission number `submission`
  // (its last one, when nobody else holds that).
  void bind_work_locked(const std::shared_ptr<Lane>& lane, Operation& op, const std::string& label,
                        Details details, uint64_t submission);
  // Publishes what iterate() found for threads without the token (active,
  // parked and background operations; notices pending).
  void publish_counts(Clock::time_point now);
  // Starts `op` (its dependency, if any, completed).
  void start(const std::shared_ptr<Operation>& op);
  // Puts `op` among the active operations, behind those of its priority.
  Operation& activate(const std::shared_ptr<Operation>& op);
  // Completes `op` with CommunicatorPoisoned, without starting it, when its
  // lane is poisoned.
  bool fail_if_poisoned(Operation& op);
  // Completes the operations of `lane` (every lane: null) still waiting for
  // their dependency with `reason`.
  void fail_waiting(const Lane* lane, const std::string& reason);
  int add_request(Operation& op, int64_t slot, Request req, size_t bytes, int peer, bool send,
                  bool recv);
  void test_requests(bool& progressed);
  // Hands a completed request (out of the table already) to its operation:
  // counts received bytes, traces, calls on_complete (aborting the
  // operation when that throws) and poisons the lane on a transport error.
  void complete_request(const Pending& p, const Completion& completion);
  // run_now()'s direct path (Operation::begin_direct), from `started`.
  enum class Direct { unavailable, completed, adopted };
  Direct run_direct(Lane& lane, const std::shared_ptr<Operation>& op, Clock::time_point started);
  // Makes a direct exchange an active operation of the engine: requests
  // still pending go into the table, the operation leaves the direct path
  // (leave_direct), fails with `error` if there is one, and then gets the
  // requests that completed, in the order they were posted.
  void adopt_direct(const std::shared_ptr<Operation>& op, DirectExchange& x,
                    std::exception_ptr error = nullptr);
  // Counts completed request `k` of `x` in the lane's traffic.
  void count_direct(Lane& lane, const DirectExchange& x, int k);
  // Completes the Works of finished operations and drops those the
  // transport released.
  void retire_finished();
  // Counts `op`, whose protocol finished, in its lane's operations and
  // traces it.
  void record_finished(const Operation& op);
  // Aborts the operations of `lane` (every lane: null) because it is poisoned.
  void abort_all(const Lane* lane, const std::string& reason);
  void inspect_stalls();
  // Poisons closed lanes whose grace period ended.
  void expire_closed_lanes(Clock::time_point now);
  // One Chrome-trace "complete" event from `start` to now; `args` is the
  // inside of its JSON args object.
  void trace_event(const std::string& name, const char* cat, int tid, Clock::time_point start,
                   const std::string& args);
  void drain_on_shutdown();
  // Poison notices: posts a listener on every new EndpointSet, tests the
  // listeners (poisoning the lanes that notices name) and the notices this
  // rank sent.
  void poll_notices();
  // Poisoning of `lane` from a timeout: adds what the operation waited for
  // to its reason and fills its TimeoutReport, returned for the caller to
  // mark ready (null when the poisoning did not come from a timeout).
  std::shared_ptr<TimeoutReport> report_timeout(Lane& lane);
  // poison() under mutex_; false when the lane was poisoned already.
  bool poison_locked(const std::shared_ptr<Lane>& lane, const std::string& reason,
                     bool notify_peers, int lost = -1);
  // `notice` came from comm rank `source` of `comms`.
  void on_notice(const EndpointSet& comms, PoisonNotice notice, int source);
  void test_notice_sends();
  // The peers the transport gave up on (Transport::take_peer_errors): the
  // active operations of each lane with such a peer fail with PeerLost
  // naming it, and the lane is poisoned (its members told).
  void on_peer_errors();
  // Sends `lane`'s PoisonNotice to its other members.
  void send_notices(const Lane& lane);
  // Cancels the listeners of endpoint sets no lane uses any more (every one: all).
  void release_listeners(bool all);
  // A listener (notice receive and heartbeat) for each set in to_listen_.
  void listen_to_new_sets();

  Tunables tunables_;
  const std::chrono::milliseconds peer_timeout_;  // RELAXCC_PEER_TIMEOUT_MS (0: no heartbeats)
  std::atomic<Backoff> backoff_;
  const std::shared_ptr<Transport> transport_;
  const Request null_request_;   // transport_->null_request()
  const bool transport_yields_;  // transport_->yields_when_idle()
  std::shared_ptr<ScratchPool> scratch_;

  // The progress token: tried, never waited for.
  std::mutex token_;
  std::atomic<std::thread::id> token_holder_{};
  std::atomic<State> state_{State::running};
  // The latest submission (EngineWork::submission) a caller drove progress
  // for. When a caller waited for the previous submission, the next caller
  // probably waits too, so submit() need not wake the engine thread.
  std::atomic<uint64_t> awaited_submission_{0};
  // Published by iterate() for threads without the token: active operations,
  // those of them whose Work completed (they only hold requests), and
  // whether this rank's own poison notices are still being pushed out.
  std::atomic<int> active_count_{0};
  std::atomic<int> parked_{0};
  std::atomic<bool> notices_pending_{false};
  std::atomic<int> background_count_{0};  // background operations, no requests pending
  uint64_t submissions_ = 0;              // under mutex_

  std::shared_ptr<Doorbell> doorbell_;
  std::mutex& mutex_;
  std::condition_variable& cv_;
  std::atomic<bool>& signalled_;
  std::atomic<int>& drivers_;  // callers in drive()
  std::deque<std::shared_ptr<Operation>> queue_;
  bool stop_ = false;
  std::vector<std::shared_ptr<Lane>> to_poison_;  // poisoned, not yet applied
  std::vector<std::weak_ptr<Lane>> closing_;      // closed, with operations maybe in flight
  std::vector<std::weak_ptr<Lane>> lanes_;        // every lane, for poison notices
  size_t prune_at_ = 64;  // add_lane drops expired entries of lanes_ and closing_ at this size
  std::vector<std::shared_ptr<EndpointSet>> to_listen_;  // new endpoint sets, no listener yet

  // Token-holder state.
  std::deque<std::shared_ptr<Operation>> incoming_;
  Clock::time_point last_inspection_ = Clock::now();
  Clock::time_point shutdown_deadline_{};
  std::vector<std::shared_ptr<Operation>> active_;   // sorted by priority, then seq
  std::vector<std::shared_ptr<Operation>> waiting_;  // for their dependency, in seq order
  std::vector<std::shared_ptr<Operation>> spawned_;  // RequestPoster::spawn, not started yet
  Clock::time_point last_background_poll_{};
  // Requests in flight at their slots (null_request_: free). Free slots
  // are taken lowest first (free_slots_ is a min-heap), so those in use stay
  // below slots_in_use_ (one past the highest in use), the range
  // Transport::test_some scans: it costs per slot, null ones included.
  std::vector<Request> requests_;
  std::vector<Pending> pending_;
  std::vector<int> free_slots_;
  int slots_in_use_ = 0;
  int num_pending_ = 0;
  bool tested_ = false;  // the last iteration called Transport::test_some
  std::vector<int> indices_;
  std::vector<Completion> completions_;
  // A posted receive of PoisonNotices from any member, per EndpointSet; it
  // keeps its EndpointSet until no lane uses it.
  struct Listener {
    std::shared_ptr<EndpointSet> comms;
    Request request;
    bool posted = false;
    // The posted receive's buffer; a detached receive keeps its own (leaked).
    std::unique_ptr<PoisonNotice> notice = std::make_unique<PoisonNotice>();
    std::unique_ptr<Heartbeat> heartbeat;  // the liveness check of its peers (heartbeat.h)
  };
  std::vector<std::unique_ptr<Listener>> listeners_;
  // Listeners of released sets whose peers have not all answered the
  // leaving beat yet (heartbeat.h): polled at each poll_notices until they
  // did or `deadline` (a peer timeout) passed, then finished; the set, and
  // its transport communicator, live until then.
  struct Releasing {
    std::unique_ptr<Listener> listener;
    Clock::time_point deadline;
  };
  std::vector<Releasing> releasing_;
  // Stops a released listener: closes its heartbeat and cancels its notice
  // receive, by `deadline`; a receive that did not cancel leaks its buffers.
  void finish_listener(std::unique_ptr<Listener> listener, Clock::time_point deadline);
  // Polls releasing_ (non-blocking), finishing those done or expired.
  void poll_releasing(Clock::time_point now);
  struct NoticeSend {
    std::shared_ptr<PoisonNotice> notice;  // one per peer (its window differs)
    Request request;
  };
  std::vector<NoticeSend> notice_sends_;
  Clock::time_point last_notice_poll_{};
  // last_notice_poll_ for threads without the token (Clock ticks): an engine
  // thread that watches runs an iteration when no poll came for
  // kIdleNoticePoll, so heartbeats go out while callers compute.
  std::atomic<Clock::rep> notices_polled_at_{0};
  // The engine thread's wait (wait_for_work): the submissions it has seen,
  // since when none came, and whether it last returned for an idle notice
  // poll (the quiet period then goes on).
  uint64_t seen_submissions_ = 0;
  Clock::time_point quiet_since_{};
  bool idle_poll_ = false;
  Clock::time_point notices_sent_at_{};

  // Declared after active_: stopped (its functions returned) before the
  // operations they work for are destroyed.
  ComputeThread compute_;

  std::ofstream trace_;
  bool trace_first_ = true;
  int trace_pid_ = 0;

  std::thread thread_;
};

}  // namespace relaxcc::engine
