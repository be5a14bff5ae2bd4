// The communication engine: the progress of every MPI call of the
// communicators that share it (a communicator, its splits and groups).
//
// Each communicator is a lane of the engine (Lane): its members (ranks of an
// MPI communicator), sequence numbers, tags, statistics and poison state.
// Operations of a lane take their order in it; priorities apply across all
// lanes, so a low-priority operation on one communicator posts one segment at
// a time while a higher one on another is active. Operations are
// resumable state machines. Each takes its sequence number (and so its tags)
// when it is submitted; the engine starts it then, or, when it was submitted
// to run after another Work, once that Work completed. It lets them post requests (in priority
// order, so that a large low-priority operation yields the network to a high-priority one), tests
// every pending request with MPI_Testsome, and hands completions back to their operation.
//
// Progress token. One progress iteration (iterate()) at a time runs, on the
// thread that holds the engine's token: only that thread calls MPI for the
// engine and touches its operations. A caller blocked in Work::wait on one of
// the engine's Works takes the token itself (drive()) and runs the iterations
// until its Work completed, so a blocking wait needs no thread hand-off (MPI
// runs at MPI_THREAD_MULTIPLE). The engine thread holds it while nobody
// waits, and steps aside while callers drive. Nobody blocks on the token:
// it is only ever tried, so releasing it never wakes a thread.
//
// Waking the engine thread costs a futex wake (about 4 us on a small VM), so
// submit() rings it only when it sleeps for good (idle), or when the last
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

#include <mpi.h>

#include <array>
#include <atomic>
#include <bitset>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "../collectives/scratch_pool.h"
#include "op_header.h"
#include "relaxcc/communicator.h"
#include "relaxcc/tunables.h"

namespace relaxcc::mpi {

class Engine;
class Lane;
class Operation;
class EngineWork;
struct RoundStream;
struct TimeoutReport;

using Clock = std::chrono::steady_clock;

// The requests of a direct exchange (Operation::begin_direct), posted
// outside the engine's request table, in the order they were posted: this
// rank's messages to one peer, the receive of the peer's header message,
// then any receives continue_direct adds. Each has the slot under which
// on_complete knows it.
struct DirectExchange {
  static constexpr int kMaxRequests = 24;
  struct Request {
    MPI_Request request;
    int64_t slot;
    size_t bytes;
    bool send;
    bool completed;  // tested complete (or failed): MPI released it
    bool consumed;   // continue_direct took it: not for on_complete
    int error;
    MPI_Status status;
  };
  int peer = -1;  // lane rank
  // Requests [0, count) are set (the others are not initialized: a small
  // exchange does not pay for clearing them).
  std::array<Request, kMaxRequests> requests;
  int count = 0;
  void add(MPI_Request request, int64_t slot, size_t bytes, bool send) {
    requests.at(static_cast<size_t>(count++)) =
        Request{request, slot, bytes, send, false, false, MPI_SUCCESS, MPI_Status{}};
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
  size_t received(int k) const {
    int got = 0;
    MPI_Get_count(&requests[static_cast<size_t>(k)].status, MPI_BYTE, &got);
    return static_cast<size_t>(got);
  }
};

// Posts MPI requests for the operations of one lane. Peers are ranks of the
// lane; tags are the lane's. Valid only on the thread that holds the
// engine's progress token.
class Transport {
 public:
  Transport(Engine& engine, Lane& lane) : engine_(engine), lane_(lane) {}

  // Non-blocking send/receive on the collective (coll == true) or the
  // point-to-point communicator. `slot` comes back in on_complete.
  void isend(Operation& op, int64_t slot, const void* buf, size_t bytes, int peer, int tag,
             bool coll = true);
  void irecv(Operation& op, int64_t slot, void* buf, size_t bytes, int peer, int tag,
             bool coll = true);
  // isend/irecv outside the engine's request table, for
  // Operation::begin_direct: run_now() tests the request itself or hands it
  // to the table.
  MPI_Request post_isend(const void* buf, size_t bytes, int peer, int tag, bool coll = true);
  MPI_Request post_irecv(void* buf, size_t bytes, int peer, int tag, bool coll = true);
  // Matched probe on the collective (or point-to-point) communicator: when a
  // message from `peer` with `tag` is waiting, returns true with its handle
  // and size, so the receive can be sized to the message and nothing is
  // ever truncated.
  bool improbe(int peer, int tag, MPI_Message* message, size_t* bytes, bool coll = true);
  // Receives a probed message into `buf` (at least `bytes` long).
  void imrecv(Operation& op, int64_t slot, void* buf, size_t bytes, MPI_Message* message, int peer);
  // Cancels every pending receive of `op` posted with `slot` (posted with
  // irecv and not cancelled before; others are left to complete).
  void cancel_receives(Operation& op, int64_t slot);

  // A higher-priority operation (of any lane) is active: post one segment at a time.
  bool throttled(const Operation& op) const;
  int rank() const;
  int size() const;
  bool poisoned() const;
  // The lane's identity check (OpHeader::lane): 0 for a communicator, a
  // hash of parent, members and key for a group.
  uint32_t lane_id() const;
  const Tunables& tunables() const;
  // The tag of `channel` for the lane's operation `seq` with lane rank
  // `peer`, in the lane's window for that peer (op_header.h).
  int collective_tag(uint64_t seq, Channel channel, int peer) const;
  // Scratch memory reused across operations (not zeroed).
  ScratchPool::Buffer scratch(size_t bytes);
  // The lane's stream of round messages from `peer` with point-to-point tag `tag`.
  RoundStream& round_stream(int peer, int tag);
  // Starts `op` on the lane of `from` (an operation of this lane), without a
  // Work or a sequence number, once the engine's current iteration ended.
  void spawn(const Operation& from, std::shared_ptr<Operation> op);
  // Runs `fn` (a reduction, a codec) on the engine's compute thread, so the
  // engine keeps polling the network meanwhile; op.on_computed(slot, error)
  // follows on the engine thread. The operation's Work does not complete
  // while a computation of it runs, even when it fails.
  void compute(Operation& op, int64_t slot, std::function<void()> fn);
  // Counts `n` late round messages dropped (CommStats::late_messages).
  void count_late(uint64_t n = 1);

 private:
  Engine& engine_;
  Lane& lane_;
};

// The tag windows (op_header.h) that the groups of one CommPair hold, per
// pair of ranks: this rank and each peer (comm ranks). A group takes, for
// each other member, the first window of its probe sequence (from its
// primary window) that no other group with that member holds: a live one,
// or one of the last kRetired destroyed ones of that pair, so that a
// poisoned group's late messages find no receive. Both ends of a pair see
// the same groups of that pair (both are members of each), so they choose
// alike when they create and destroy those groups in the same order; the
// choice is local, no communication. When a retired window leaves the
// pair's list, the messages from that peer still queued on its tags (the
// sequence numbers its group could have left unreceived) are received and
// dropped, so that the next group given that window never reads them.
// Bounded: per peer, the live groups and kRetired more.
class TagWindows {
 public:
  // Destroyed groups whose windows a pair keeps reserved.
  static constexpr size_t kRetired = 32;
  // The sequence numbers whose late messages a window drains: of a group
  // that failed (poisoned, or destroyed with operations in flight), its last
  // kDrainBehind (a poisoning stops the latest ones); of every group,
  // kDrainAhead past its last one (a peer that called operations this rank
  // never did).
  static constexpr uint64_t kDrainBehind = 64;
  static constexpr uint64_t kDrainAhead = 16;
  TagWindows(MPI_Comm coll, int max_tag)
      : coll_(coll), max_tag_(max_tag), count_(group_windows(max_tag)) {}
  TagWindows(const TagWindows&) = delete;
  TagWindows& operator=(const TagWindows&) = delete;

  // Reserves a window for every member of `comm_members` but `me` (an index
  // into it): the result, by index (0 at `me`), is the first free window of
  // each pair from `primary` on, the rest of the probe sequence derived
  // from `identity`. Throws CommunicationError naming `group` when every
  // window of a pair is held by live groups (or when the tag space has one
  // window only and another group holds it).
  std::vector<uint32_t> reserve(const std::vector<int>& comm_members, size_t me, uint64_t primary,
                                uint64_t identity, const std::string& group);
  // The group that reserved `windows` is destroyed, its collective
  // operations numbered below `seq_end`, `failed` or not: they stay reserved
  // until kRetired more groups of the pair were destroyed, then their late
  // messages are drained (kDrainBehind, kDrainAhead); those queued already
  // are drained now when `drain_now` (a poisoned group: nothing of it
  // receives any more).
  void retire(const std::vector<int>& comm_members, size_t me, const std::vector<uint32_t>& windows,
              uint64_t seq_end, bool failed, bool drain_now);
  // What it holds (CommStats::group_windows): windows of live groups and
  // retired ones, over every pair.
  struct Counts {
    size_t live = 0, retired = 0;
  };
  Counts counts() const;

 private:
  struct Retired {
    uint32_t window;
    uint64_t seq_begin, seq_end;  // drained: [seq_begin, seq_end + kDrainAhead)
  };
  struct Pair {
    std::unordered_set<uint32_t> held;  // live and retired
    std::deque<Retired> retired;        // oldest first
  };
  // Receives and drops what comm rank `peer` sent on `r`'s tags (under mutex_).
  void drain(int peer, const Retired& r);
  mutable std::mutex mutex_;
  std::unordered_map<int, Pair> pairs_;  // by the peer's comm rank
  const MPI_Comm coll_;
  const int max_tag_;
  const uint32_t count_;  // group_windows(): windows 1..count_
};

// The MPI communicators a set of lanes sends on: the collective one (relaxcc's
// tags) and the point-to-point one (users' tags), and the tag windows its
// groups hold. Freed with the last lane that uses them, unless MPI is
// finalized by then.
struct CommPair {
  CommPair(MPI_Comm coll_comm, MPI_Comm p2p_comm);
  ~CommPair();
  CommPair(const CommPair&) = delete;
  CommPair& operator=(const CommPair&) = delete;
  MPI_Comm coll = MPI_COMM_NULL;
  MPI_Comm p2p = MPI_COMM_NULL;
  int size = 1;
  int max_tag = 32767;
  std::unique_ptr<TagWindows> windows;
};

// A round message (P2POptions::round) taken off the wire before its receive:
// kept for the receive of its round.
struct EarlyMessage {
  uint64_t round = 0;
  ScratchPool::Buffer message;
  size_t bytes = 0;
};

// The round messages from one peer with one point-to-point tag, in a lane.
// Engine thread only.
struct RoundStream {
  // The round receives waiting (each named by an address of its own), in
  // submission order: the first one takes messages.
  std::deque<const void*> receivers;
  std::deque<EarlyMessage> early;
  // The latest round whose receive was abandoned (0: none): while no receive
  // waits, a sweeper drops the stream's messages up to this round until
  // sweep_until.
  uint64_t abandoned = 0;
  Clock::time_point sweep_until{};
  bool sweeping = false;
  // Matched receives (MPI_Imrecv) in flight on the stream: an abandoned
  // receive's or the sweeper's. The first receiver does not probe while
  // one is, so a message is never taken past an older one still arriving.
  int matched = 0;
};

// A lane's counters (CommStats): written only by the progress token's holder,
// read by any thread (Engine::stats) without a lock.
struct LaneCounters {
  explicit LaneCounters(int size) : sent_to(size), received_from(size) {}
  std::atomic<uint64_t> bytes_sent{0}, bytes_received{0}, operations{0}, late_messages{0};
  std::vector<std::atomic<uint64_t>> sent_to, received_from;  // per lane rank
  // One writer at a time (the token orders them): no locked instruction.
  static void add(std::atomic<uint64_t>& counter, uint64_t n) {
    counter.store(counter.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
};

// One communicator's (or group's) share of an engine. Created by
// Engine::add_lane; operations keep their lane alive.
class Lane {
 public:
  // `windows`: a group's tag window per lane rank (TagWindows::reserve),
  // empty for a communicator (window 0).
  Lane(Engine& engine, std::shared_ptr<CommPair> comms, std::vector<int> members, int rank,
       uint32_t id, std::vector<uint32_t> windows, Tunables tunables);
  ~Lane();
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  uint32_t id() const { return id_; }
  const Tunables& tunables() const { return tunables_; }
  bool poisoned() const { return poisoned_.load(); }
  // Rank in the MPI communicators of lane rank `r`.
  int comm_rank(int r) const { return members_.empty() ? r : members_[r]; }
  // The tag window with lane rank `r` (op_header.h).
  uint32_t window(int r) const { return windows_.empty() ? 0 : windows_[r]; }
  const std::shared_ptr<CommPair>& comms() const { return comms_; }
  // Gives the lane's tag windows back to the CommPair (as retired), once:
  // when its communicator is destroyed (Engine::close_lane), or with the
  // lane.
  void retire_windows();

 private:
  friend class Engine;
  friend class Transport;
  friend class Operation;
  Engine& engine_;
  Transport transport_;
  std::shared_ptr<CommPair> comms_;
  std::vector<int> members_;  // empty: every rank of comms_, in order
  int rank_ = 0;
  int size_ = 1;
  uint32_t id_ = 0;
  std::vector<uint32_t> windows_;  // by lane rank; empty: window 0
  std::atomic<bool> windows_retired_{false};
  Tunables tunables_;
  // Under the engine's mutex.
  uint64_t next_seq_ = 1;
  uint64_t next_p2p_seq_ = 1;
  std::string poison_reason_;
  // Written by the token's holder only.
  LaneCounters counters_;
  std::atomic<int64_t> requests_pending_{0};
  Clock::time_point close_deadline_{};  // set when its communicator is gone
  bool notify_peers_ = false;           // its poisoning started here: tell the members
  // Its poisoning started with a wait on this Work that timed out; the
  // engine thread reports what the operation still waited for.
  const Work* timed_out_ = nullptr;
  std::shared_ptr<TimeoutReport> timeout_report_;
  std::atomic<bool> poisoned_{false};
  // Engine thread only: round streams by (peer, tag).
  std::map<std::pair<int, int>, RoundStream> round_streams_;
  // Sequence numbers of the lane's collective operations not released yet
  // (submitted, and not destroyed): a new one may be at most kLaneSeqs - 1
  // past the oldest, or their tags would repeat (op_header.h). One bit per
  // sequence number of the window from oldest_in_flight_ (modulo kLaneSeqs).
  std::mutex in_flight_mutex_;
  std::bitset<kLaneSeqs> in_flight_;
  uint64_t oldest_in_flight_ = 1;  // the oldest unreleased one, or next_seq_
};

// A resumable operation. Every method runs on the thread that holds the
// engine's progress token (the engine thread or a waiting caller).
class Operation {
 public:
  Operation(std::string name, int priority) : name_(std::move(name)), priority_(priority) {}
  // Releases the operation's sequence number (and so its tags) in its lane.
  virtual ~Operation() { release_seq(); }

  // Posts the first requests. Called once: in submission order, or once the
  // Work it runs after completed.
  virtual void start(Transport& t) = 0;
  // Called instead of start() when the Work it runs after failed with
  // `error`: fail, telling the peers where the protocol allows. The default
  // aborts without starting (the peers see their own timeout).
  virtual void start_failed(Transport& t, std::exception_ptr error) { abort(t, std::move(error)); }
  // Posts whatever can be posted now. Called every engine iteration.
  virtual void progress(Transport&) {}
  // Transport::compute's function for `slot` returned (error: what it threw).
  virtual void on_computed(Transport&, int64_t /*slot*/, std::exception_ptr /*error*/) {}
  // Request `slot` completed. `error` is the MPI error code (MPI_SUCCESS).
  virtual void on_complete(Transport& t, int64_t slot, const MPI_Status& status, int error) = 0;
  // Stop: post nothing new, tell peers that wait on this rank, drain.
  // The first error wins; later ones are ignored.
  virtual void abort(Transport& t, std::exception_ptr error) = 0;
  // The operation finished its protocol (pending requests aside).
  virtual bool done() const = 0;
  // Collective operations take the communicator's next sequence number
  // (their tags derive from it), so every rank numbers them alike.
  // Point-to-point operations involve only some ranks and count separately.
  virtual bool collective() const { return true; }
  // Which peers it still waits for ("rank 3: data 2/8"), for the stall
  // inspector and timeout messages.
  virtual std::string waiting_for() const { return {}; }
  // A background operation (Transport::spawn: a sweeper) keeps the engine
  // looking only about every millisecond: while it has no request pending,
  // the engine counts as idle and calls its progress() at that rate.
  // Shutdown does not wait for it.
  virtual bool background() const { return false; }
  // Before the Work completes: records what the Work reports beyond success
  // (Work::set_contributions).
  virtual void report(Work&) const {}
  // The direct path of Engine::run_now, for an operation that exchanges a
  // few messages with one peer. begin_direct() does what start() would, but
  // posts with Transport::post_isend/post_irecv into `x`; it returns false,
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
  virtual bool begin_direct(Transport&, DirectExchange&) { return false; }
  virtual DirectStep continue_direct(Transport&, DirectExchange&) { return DirectStep::refused; }
  virtual void leave_direct(Transport&) {}

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
  friend class Transport;
  // Releases its sequence number in its lane (once the engine dropped it).
  void release_seq();
  int priority_;
  uint64_t seq_ = 0;
  int pending_ = 0;
  int computing_ = 0;  // Transport::compute calls not returned to on_computed yet
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
  // Transport::compute results not handed to their operation yet (under mutex).
  struct Computed {
    Operation* op;
    int64_t slot;
    std::exception_ptr error;
  };
  std::vector<Computed> computed;
  // Callers driving the engine's progress (Engine::drive): they pick up what
  // is rung, so the engine thread need not be woken.
  std::atomic<int> drivers{0};
  void ring_released();
};

// The engine's compute thread: runs Transport::compute's functions in order
// and hands each result to `done` (which rings the engine's doorbell).
// Started with the first function.
class ComputeThread {
 public:
  using Done = std::function<void(Operation*, int64_t, std::exception_ptr)>;
  explicit ComputeThread(Done done) : done_(std::move(done)) {}
  ~ComputeThread();
  ComputeThread(const ComputeThread&) = delete;
  ComputeThread& operator=(const ComputeThread&) = delete;
  void submit(Operation* op, int64_t slot, std::function<void()> fn);

 private:
  struct Task {
    Operation* op;
    int64_t slot;
    std::function<void()> fn;
  };
  void loop();
  Done done_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stop_ = false;
  std::thread thread_;
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
  struct Polling {
    Backoff backoff = Backoff::sleep;
    // MPI's progress yields the CPU when it finds nothing
    // (mpi_yields_when_idle): in sleep mode, a poll that tested requests
    // needs no sched_yield of its own.
    bool mpi_yields = false;
  };
  // `tunables`: the engine's own (spin, sleep, stall warnings, trace); each
  // lane has its own for its operations.
  Engine(Tunables tunables, Polling polling);
  // Changes the polling (creation learns the node's layout after the engine
  // started).
  void set_polling(Polling polling);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // A lane over `members` (ranks of comms; empty: all of them, in order), in
  // which this process is rank `rank`, with tag windows `windows` (see Lane).
  std::shared_ptr<Lane> add_lane(std::shared_ptr<CommPair> comms, std::vector<int> members,
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
  // throws CommunicatorPoisoned.
  void poison(const std::shared_ptr<Lane>& lane, const std::string& reason,
              bool notify_peers = true);
  // poison() for a wait on `work` that timed out: the poison reason (and so
  // the peers' notice) names the peers the operation still waited for.
  // Returns them ("waiting for: rank 3 (header)"), or the reason the lane
  // was poisoned already, for the Timeout message (empty if the engine
  // thread did not answer within 200 ms).
  std::string poison_on_timeout(const std::shared_ptr<Lane>& lane, const Work& work,
                                const std::string& reason);
  CommStats stats(const Lane& lane) const;
  // Whether the calling thread holds the progress token (and so may call MPI
  // for this engine).
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
  friend class Transport;
  struct Pending {
    Operation* op = nullptr;
    int64_t slot = 0;
    size_t bytes = 0;
    int peer = -1;  // lane rank
    bool send = false;
    bool recv = false;
    Clock::time_point posted;
    // A posted receive not cancelled yet. Matched receives (MPI_Imrecv) are
    // never cancellable, and no request is cancelled twice: Open MPI 4.1's
    // ob1 crashed on a second cancel of a receive.
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
  // Wakes the engine thread unless it runs (under mutex_ or not).
  void wake_engine(bool only_if_idle);
  // Sleep length of the back-off after `sleep_us`: doubling to
  // max_sleep_us, to kParkedSleep when only parked requests remain.
  int64_t next_sleep(int64_t sleep_us) const;
  // The back-off after an iteration that moved nothing, `idle` after the
  // last one that did (`tested`: it called MPI_Testsome): busy polling (own
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
  int add_request(Operation& op, int64_t slot, MPI_Request req, size_t bytes, int peer, bool send,
                  bool recv);
  void test_requests(bool& progressed);
  // Hands a completed request (out of the table already) to its operation:
  // counts received bytes, traces, calls on_complete (aborting the
  // operation when that throws) and poisons the lane on a transport error.
  void complete_request(const Pending& p, const MPI_Status& status, int err);
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
  // Poison notices: posts a listener on every new CommPair, tests the
  // listeners (poisoning the lanes that notices name) and the notices this
  // rank sent.
  void poll_notices();
  // Poisoning of `lane` from a timeout: adds what the operation waited for
  // to its reason and fills its TimeoutReport, returned for the caller to
  // mark ready (null when the poisoning did not come from a timeout).
  std::shared_ptr<TimeoutReport> report_timeout(Lane& lane);
  // poison() under mutex_; false when the lane was poisoned already.
  bool poison_locked(const std::shared_ptr<Lane>& lane, const std::string& reason,
                     bool notify_peers);
  // `notice` came from comm rank `source` of `comms`.
  void on_notice(const CommPair& comms, PoisonNotice notice, int source);
  void test_notice_sends();
  // Sends `lane`'s PoisonNotice to its other members.
  void send_notices(const Lane& lane);
  // Cancels the listeners of CommPairs no lane uses any more (every one: all).
  void release_listeners(bool all);

  Tunables tunables_;
  std::atomic<Backoff> backoff_;
  std::atomic<bool> mpi_yields_;
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
  std::vector<std::shared_ptr<CommPair>> to_listen_;  // new CommPairs, no listener yet

  // Token-holder state.
  std::deque<std::shared_ptr<Operation>> incoming_;
  Clock::time_point last_inspection_ = Clock::now();
  Clock::time_point shutdown_deadline_{};
  std::vector<std::shared_ptr<Operation>> active_;   // sorted by priority, then seq
  std::vector<std::shared_ptr<Operation>> waiting_;  // for their dependency, in seq order
  std::vector<std::shared_ptr<Operation>> spawned_;  // Transport::spawn, not started yet
  Clock::time_point last_background_poll_{};
  // Requests in flight at their slots (MPI_REQUEST_NULL: free). Free slots
  // are taken lowest first (free_slots_ is a min-heap), so those in use stay
  // below slots_in_use_ (one past the highest in use), the range
  // MPI_Testsome scans: it costs per slot, null ones included.
  std::vector<MPI_Request> requests_;
  std::vector<Pending> pending_;
  std::vector<int> free_slots_;
  int slots_in_use_ = 0;
  int num_pending_ = 0;
  bool tested_ = false;  // the last iteration called MPI_Testsome
  std::vector<int> indices_;
  std::vector<MPI_Status> statuses_;
  // A posted receive of PoisonNotices from any member, per CommPair; it
  // keeps its CommPair until no lane uses it.
  struct Listener {
    std::shared_ptr<CommPair> comms;
    MPI_Request request = MPI_REQUEST_NULL;
    PoisonNotice notice;
  };
  std::vector<std::unique_ptr<Listener>> listeners_;
  struct NoticeSend {
    std::shared_ptr<PoisonNotice> notice;  // one per peer (its window differs)
    MPI_Request request = MPI_REQUEST_NULL;
  };
  std::vector<NoticeSend> notice_sends_;
  Clock::time_point last_notice_poll_{};
  Clock::time_point notices_sent_at_{};

  // Declared after active_: stopped (its functions returned) before the
  // operations they work for are destroyed.
  ComputeThread compute_;

  std::ofstream trace_;
  bool trace_first_ = true;
  int trace_pid_ = 0;

  std::thread thread_;
};

// The Work of an engine operation: a waiter drives the engine's progress;
// an expiring wait() poisons its lane (if the engine and the lane still
// exist).
class EngineWork final : public Work {
 public:
  // Described as "<name> #<seq> of '<label>' (tag <tag>, <details>)".
  EngineWork(const Operation& op, const std::string& label, int tag, Engine::Details details,
             std::chrono::milliseconds default_timeout, std::weak_ptr<Engine> engine,
             std::weak_ptr<Lane> lane, uint64_t submission)
      : Work(std::string(), default_timeout),
        engine_(std::move(engine)),
        lane_(std::move(lane)),
        name_(op.name()),
        label_(label),
        seq_(op.seq()),
        tag_(tag),
        details_(std::move(details)),
        submission_(submission) {}
  // The Work of another submission of an operation that keeps it (only when
  // nothing else references it, completed).
  void rebind(const Operation& op, const std::string& label, int tag, Engine::Details details,
              uint64_t submission) {
    reset(std::string());
    label_ = label;
    seq_ = op.seq();
    tag_ = tag;
    details_ = std::move(details);
    submission_ = submission;
  }
  // Blocks on completion (for drive()'s sleeps).
  bool sleep_until(Clock::time_point deadline) { return block_until(deadline); }
  // Its number among the engine's submissions (from 1).
  uint64_t submission() const { return submission_; }

 protected:
  std::string describe() const override;
  std::string on_timeout(const std::string& reason) override;
  bool await(Clock::time_point deadline) override;
  void on_callback_queued() override;

 private:
  const std::weak_ptr<Engine> engine_;
  const std::weak_ptr<Lane> lane_;
  const std::string name_;
  std::string label_;
  uint64_t seq_;
  int tag_;
  Engine::Details details_;
  uint64_t submission_;
};

// Throws CommunicationError naming `what` when rc is not MPI_SUCCESS.
void check_mpi(int rc, const char* what);
std::string mpi_error_string(int rc);
// Whether MPI_Finalize has run (relaxcc then makes no MPI call).
bool mpi_finalized();

}  // namespace relaxcc::mpi
