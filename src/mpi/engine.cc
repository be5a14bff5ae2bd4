#include "engine.h"

#include "op_header.h"

#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <sstream>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "relaxcc/logging.h"

namespace relaxcc::mpi {

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, len);
}

void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) [[unlikely]]
    RELAXCC_THROW(CommunicationError, what, " failed: ", mpi_error_string(rc));
}

namespace {
// How long an idle engine keeps pushing out its own poison notices.
constexpr auto kNoticeSendLimit = std::chrono::seconds(10);
// How often poison notices are looked for.
constexpr auto kNoticePoll = std::chrono::milliseconds(1);
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
thread_local int tokens_held = 0;

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
}  // namespace

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// ---- Operation ---------------------------------------------------------------

void Operation::reset_for_reuse(int priority) {
  release_seq();
  priority_ = priority;
  seq_ = 0;
  pending_ = computing_ = 0;
  error_ = nullptr;
  stall_reported_ = work_completed_ = false;
  after_.reset();  // work_ stays: submit reuses it when it can
  prologue_ = nullptr;
  released_.store(false, std::memory_order_relaxed);
}

void Operation::release_seq() {
  if (!in_flight_) return;
  in_flight_ = false;
  Lane& lane = *lane_;
  std::lock_guard<std::mutex> lock(lane.in_flight_mutex_);
  lane.in_flight_.reset(seq_ % kLaneSeqs);
  while (lane.oldest_in_flight_ < lane.next_seq_ &&
         !lane.in_flight_[lane.oldest_in_flight_ % kLaneSeqs])
    ++lane.oldest_in_flight_;
}

// ---- Transport -------------------------------------------------------------

namespace {
void require_engine_thread(const Engine& e) {
  RELAXCC_ENFORCE(e.holds_token(), InternalError,
                  "MPI call without the engine's progress token: only its holder may call MPI");
}
int byte_count(size_t bytes) {
  RELAXCC_ENFORCE_LE(bytes, static_cast<size_t>(INT32_MAX), InvalidArgument,
                     "one message carries at most 2^31-1 bytes");
  return static_cast<int>(bytes);
}
}  // namespace

MPI_Request Transport::post_isend(const void* buf, size_t bytes, int peer, int tag, bool coll) {
  require_engine_thread(engine_);
  MPI_Request req;
  check_mpi(MPI_Isend(buf, byte_count(bytes), MPI_BYTE, lane_.comm_rank(peer), tag,
                      coll ? lane_.comms_->coll : lane_.comms_->p2p, &req),
            "MPI_Isend");
  return req;
}

MPI_Request Transport::post_irecv(void* buf, size_t bytes, int peer, int tag, bool coll) {
  require_engine_thread(engine_);
  MPI_Request req;
  check_mpi(MPI_Irecv(buf, byte_count(bytes), MPI_BYTE, lane_.comm_rank(peer), tag,
                      coll ? lane_.comms_->coll : lane_.comms_->p2p, &req),
            "MPI_Irecv");
  return req;
}

void Transport::isend(Operation& op, int64_t slot, const void* buf, size_t bytes, int peer, int tag,
                      bool coll) {
  engine_.add_request(op, slot, post_isend(buf, bytes, peer, tag, coll), bytes, peer, true, false);
}

void Transport::irecv(Operation& op, int64_t slot, void* buf, size_t bytes, int peer, int tag,
                      bool coll) {
  const int index = engine_.add_request(op, slot, post_irecv(buf, bytes, peer, tag, coll), bytes,
                                        peer, false, true);
  engine_.pending_[index].cancellable = true;
}

bool Transport::improbe(int peer, int tag, MPI_Message* message, size_t* bytes, bool coll) {
  require_engine_thread(engine_);
  int flag = 0;
  MPI_Status status;
  check_mpi(MPI_Improbe(lane_.comm_rank(peer), tag, coll ? lane_.comms_->coll : lane_.comms_->p2p,
                        &flag, message, &status),
            "MPI_Improbe");
  if (!flag) return false;
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  *bytes = static_cast<size_t>(count);
  return true;
}

void Transport::imrecv(Operation& op, int64_t slot, void* buf, size_t bytes, MPI_Message* message,
                       int peer) {
  require_engine_thread(engine_);
  MPI_Request req;
  check_mpi(MPI_Imrecv(buf, byte_count(bytes), MPI_BYTE, message, &req), "MPI_Imrecv");
  engine_.add_request(op, slot, req, bytes, peer, false, true);
}

void Transport::cancel_receives(Operation& op, int64_t slot) {
  require_engine_thread(engine_);
  for (int i = 0; i < engine_.slots_in_use_; ++i) {
    auto& p = engine_.pending_[i];
    if (p.op == &op && p.slot == slot && p.cancellable &&
        engine_.requests_[i] != MPI_REQUEST_NULL) {
      p.cancellable = false;
      MPI_Cancel(&engine_.requests_[i]);
    }
  }
}

bool Transport::throttled(const Operation& op) const {
  for (const auto& other : engine_.active_)
    if (other->priority() > op.priority() && !other->done()) return true;
  return false;
}

int Transport::rank() const {
  return lane_.rank_;
}
int Transport::size() const {
  return lane_.size_;
}
bool Transport::poisoned() const {
  return lane_.poisoned();
}
uint32_t Transport::lane_id() const {
  return lane_.id_;
}
const Tunables& Transport::tunables() const {
  return lane_.tunables_;
}
int Transport::collective_tag(uint64_t seq, Channel channel, int peer) const {
  return mpi::collective_tag(lane_.window(peer), seq, channel, lane_.comms_->max_tag);
}
ScratchPool::Buffer Transport::scratch(size_t bytes) {
  return engine_.scratch_->acquire(bytes);
}
RoundStream& Transport::round_stream(int peer, int tag) {
  return lane_.round_streams_[{peer, tag}];
}
void Transport::spawn(const Operation& from, std::shared_ptr<Operation> op) {
  require_engine_thread(engine_);
  op->lane_ = from.lane_;
  op->started_ = Clock::now();
  engine_.spawned_.push_back(std::move(op));
}
void Transport::compute(Operation& op, int64_t slot, std::function<void()> fn) {
  require_engine_thread(engine_);
  ++op.computing_;
  engine_.compute_.submit(&op, slot, std::move(fn));
}
void Transport::count_late(uint64_t n) {
  LaneCounters::add(lane_.counters_.late_messages, n);
}

// ---- CommPair and Lane -------------------------------------------------------

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
                        ": the transport's tags (MPI_TAG_UB) leave one tag window, and another "
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
      RELAXCC_ENFORCE(chosen != 0, CommunicationError, group, ": all ", count_,
                      " tag windows shared with rank ", comm_members[i],
                      " are held by live groups (MPI_TAG_UB limits them): destroy some first");
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
  if (mpi_finalized()) return;
  // No lane receives on these tags from `peer` (the window is nobody's), so
  // this thread may take them off the transport. Queued messages are
  // received at once; a large one whose data has not come within
  // kDrainWait is left to complete into a buffer kept for it.
  constexpr auto kDrainWait = std::chrono::milliseconds(50);
  for (uint64_t seq = r.seq_begin; seq < r.seq_end + kDrainAhead; ++seq) {
    for (int c = 0; c < kTagChannels; ++c) {
      const int tag = collective_tag(r.window, seq, static_cast<Channel>(c), max_tag_);
      for (;;) {
        int flag = 0;
        MPI_Message message;
        MPI_Status status;
        if (MPI_Improbe(peer, tag, coll_, &flag, &message, &status) != MPI_SUCCESS || !flag) break;
        int bytes = 0;
        MPI_Get_count(&status, MPI_BYTE, &bytes);
        auto buffer = std::make_unique<std::vector<unsigned char>>(std::max(bytes, 1));
        MPI_Request request;
        if (MPI_Imrecv(buffer->data(), bytes, MPI_BYTE, &message, &request) != MPI_SUCCESS) break;
        const auto deadline = Clock::now() + kDrainWait;
        int done = 0;
        while (MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done &&
               Clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        if (!done) {
          RELAXCC_LOG(warn, "a late message of a destroyed group did not arrive within ",
                      kDrainWait.count(), " ms; its buffer is kept (leaked)");
          MPI_Request_free(&request);
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

CommPair::CommPair(MPI_Comm coll_comm, MPI_Comm p2p_comm) : coll(coll_comm), p2p(p2p_comm) {
  MPI_Comm_size(coll, &size);
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(coll, MPI_TAG_UB, &ub, &flag);
  if (flag && ub != nullptr) max_tag = *ub;
  windows = std::make_unique<TagWindows>(coll, max_tag);
}

CommPair::~CommPair() {
  if (mpi_finalized()) return;
  if (coll != MPI_COMM_NULL) MPI_Comm_free(&coll);
  if (p2p != MPI_COMM_NULL) MPI_Comm_free(&p2p);
}

Lane::Lane(Engine& engine, std::shared_ptr<CommPair> comms, std::vector<int> members, int rank,
           uint32_t id, std::vector<uint32_t> windows, Tunables tunables)
    : engine_(engine),
      transport_(engine, *this),
      comms_(std::move(comms)),
      members_(std::move(members)),
      rank_(rank),
      size_(members_.empty() ? comms_->size : static_cast<int>(members_.size())),
      id_(id),
      windows_(std::move(windows)),
      tunables_(std::move(tunables)),
      counters_(size_) {}

Lane::~Lane() {
  retire_windows();
}

void Lane::retire_windows() {
  if (windows_.empty() || windows_retired_.exchange(true)) return;
  uint64_t seq_end = 0;
  bool in_flight = false;
  {
    std::lock_guard<std::mutex> seqs(in_flight_mutex_);  // (next_seq_ grows under it too)
    seq_end = next_seq_;
    in_flight = oldest_in_flight_ < next_seq_;
  }
  const bool failed = poisoned();
  comms_->windows->retire(members_, static_cast<size_t>(rank_), windows_, seq_end,
                          failed || in_flight, failed);
}

// ---- Engine ----------------------------------------------------------------

Engine::Engine(Tunables tunables, Polling polling)
    : tunables_(std::move(tunables)),
      backoff_(polling.backoff),
      mpi_yields_(polling.mpi_yields),
      scratch_(std::make_shared<ScratchPool>(size_t{256} << 20)),
      doorbell_(std::make_shared<Doorbell>()),
      mutex_(doorbell_->mutex),
      cv_(doorbell_->cv),
      signalled_(doorbell_->signalled),
      drivers_(doorbell_->drivers),
      compute_([bell = doorbell_](Operation* op, int64_t slot, std::exception_ptr error) {
        {
          std::lock_guard<std::mutex> lock(bell->mutex);
          bell->computed.push_back(Doorbell::Computed{op, slot, std::move(error)});
          bell->signalled.store(true, std::memory_order_release);
        }
        bell->cv.notify_all();
      }) {
  MPI_Comm_rank(MPI_COMM_WORLD, &trace_pid_);
  if (!tunables_.trace_file.empty()) {
    // One file per engine: the process's first tracing engine writes
    // <file>.<rank>.json, later ones <file>.<rank>.<k>.json.
    static std::atomic<int> tracing_engines{0};
    const int k = tracing_engines.fetch_add(1);
    const std::string path =
        detail::concat(tunables_.trace_file, ".", process_rank() >= 0 ? process_rank() : trace_pid_,
                       k > 0 ? detail::concat(".", k) : std::string(), ".json");
    trace_.open(path);
    if (trace_.good())
      trace_ << "[\n";
    else
      RELAXCC_LOG(warn, "cannot open trace file ", path);
  }
  thread_ = std::thread([this] { loop(); });
}

void Engine::set_polling(Polling polling) {
  backoff_.store(polling.backoff);
  mpi_yields_.store(polling.mpi_yields);
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    signalled_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  thread_.join();
  if (trace_.is_open()) trace_ << "\n]\n";
}

std::shared_ptr<Lane> Engine::add_lane(std::shared_ptr<CommPair> comms, std::vector<int> members,
                                       int rank, uint32_t id, std::vector<uint32_t> windows,
                                       Tunables tunables) {
  auto lane = std::make_shared<Lane>(*this, comms, std::move(members), rank, id, std::move(windows),
                                     std::move(tunables));
  std::lock_guard<std::mutex> lock(mutex_);
  // A destroyed lane's storage goes with the last weak reference: the lists
  // drop theirs as they double (not only at the next inspection).
  const auto expired = [](const std::weak_ptr<Lane>& w) { return w.expired(); };
  if (lanes_.size() + closing_.size() >= prune_at_) {
    lanes_.erase(std::remove_if(lanes_.begin(), lanes_.end(), expired), lanes_.end());
    closing_.erase(std::remove_if(closing_.begin(), closing_.end(), expired), closing_.end());
    prune_at_ = std::max<size_t>(64, 2 * (lanes_.size() + closing_.size()));
  }
  lanes_.push_back(lane);
  to_listen_.push_back(std::move(comms));
  return lane;
}

void Engine::close_lane(const std::shared_ptr<Lane>& lane) {
  lane->retire_windows();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    lane->close_deadline_ = Clock::now() + std::chrono::milliseconds(std::min<int64_t>(
                                               lane->tunables_.timeout_ms, 10000));
    closing_.push_back(lane);
  }
}

// ---- ComputeThread -------------------------------------------------------------

ComputeThread::~ComputeThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ComputeThread::submit(Operation* op, int64_t slot, std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(Task{op, slot, std::move(fn)});
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  cv_.notify_one();
}

void ComputeThread::loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (stop_) return;  // the engine is gone: nobody waits for the rest
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    std::exception_ptr error;
    try {
      task.fn();
    } catch (...) {
      error = std::current_exception();
    }
    done_(task.op, task.slot, std::move(error));
  }
}

void Doorbell::ring_released() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    released = true;
    signalled.store(true, std::memory_order_seq_cst);
  }
  // Callers that drive pick it up (and wake the engine thread when they leave).
  if (drivers.load(std::memory_order_seq_cst) == 0) cv.notify_all();
}

void Engine::take_seq_locked(Lane& lane, Operation& op, Clock::time_point now) {
  if (lane.poisoned())
    RELAXCC_THROW(CommunicatorPoisoned, op.name(), ": the communicator is poisoned (",
                  lane.poison_reason_, ") and accepts no more operations");
  RELAXCC_ENFORCE(!stop_, CommunicatorPoisoned, op.name(), ": the communicator is shutting down");
  if (op.collective()) {
    std::lock_guard<std::mutex> seqs(lane.in_flight_mutex_);
    const uint64_t oldest = lane.oldest_in_flight_;
    if (lane.next_seq_ - oldest >= kLaneSeqs)
      RELAXCC_THROW(CommunicationError, op.name(), " #", lane.next_seq_, ": ", kLaneSeqs,
                    " collective operations of this communicator are in flight (the oldest is #",
                    oldest, "): their tags would repeat; wait for earlier ones first");
    // With none in flight, oldest_in_flight_ is this one already.
    op.seq_ = lane.next_seq_++;
    lane.in_flight_.set(op.seq_ % kLaneSeqs);
    op.in_flight_ = true;
  } else {
    op.seq_ = lane.next_p2p_seq_++;
  }
  op.submitted_ = now;
}

void Engine::bind_work_locked(const std::shared_ptr<Lane>& lane, Operation& op,
                              const std::string& label, Details details, uint64_t submission) {
  const int tag =
      lane->transport_.collective_tag(op.seq_, Channel::header, (lane->rank_ + 1) % lane->size_);
  // A reused operation brings its last Work: reused too when nobody holds it.
  if (op.work_ && op.work_.use_count() == 1 && op.work_->is_completed()) {
    std::atomic_thread_fence(std::memory_order_acquire);  // the last holder's release
    op.work_->rebind(op, label, tag, std::move(details), submission);
  } else {
    op.work_ = std::make_shared<EngineWork>(op, label, tag, std::move(details),
                                            std::chrono::milliseconds(lane->tunables_.timeout_ms),
                                            weak_from_this(), lane, submission);
  }
}

std::shared_ptr<Work> Engine::submit(const std::shared_ptr<Lane>& lane,
                                     std::shared_ptr<Operation> op, Details details,
                                     const OpOptions& options) {
  const WorkPtr& after = options.after;
  std::shared_ptr<EngineWork> work;
  std::weak_ptr<Operation> waiting = op;
  bool ring = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    take_seq_locked(*lane, *op, Clock::now());
    op->lane_ = lane;
    bind_work_locked(lane, *op, options.label, std::move(details), submissions_ + 1);
    work = op->work_;
    op->after_ = after;
    queue_.push_back(std::move(op));
    signalled_.store(true, std::memory_order_seq_cst);
    const bool awaited = awaited_submission_.load(std::memory_order_relaxed) == submissions_;
    ++submissions_;
    // Callers that drive pick it up. Otherwise ring the engine thread when it
    // sleeps for good, or when nobody waited for the previous operation
    // (this caller probably does not wait either: overlap); else it watches
    // and picks the operation up within kWatchInterval, unless this caller
    // waits first, as the previous one did.
    const State state = state_.load(std::memory_order_relaxed);
    ring = drivers_.load(std::memory_order_seq_cst) == 0 && (state == State::idle || !awaited);
  }
  if (ring) cv_.notify_all();
  // Registered after the operation is queued: a dependency that already
  // completed runs the callback here, at once.
  if (after) {
    after->then([bell = doorbell_, waiting](const Work&) {
      if (auto waiter = waiting.lock()) waiter->released_.store(true, std::memory_order_release);
      bell->ring_released();
    });
  }
  return work;
}

std::shared_ptr<Work> Engine::run_now(const std::shared_ptr<Lane>& lane,
                                      const std::shared_ptr<Operation>& op, Details details,
                                      const OpOptions& options, const WorkPtr& done) {
  // A completion callback must not block (nor take a token it may hold).
  if (options.after || Engine::drives_progress_here()) return nullptr;
  TokenHold hold(token_, token_holder_);
  if (!hold || !active_.empty() || !waiting_.empty() || !spawned_.empty()) return nullptr;
  // Poison notices as iterate() picks them up before it starts an operation.
  auto now = Clock::now();
  if (now - last_notice_poll_ > kNoticePoll) poll_notices();
  uint64_t submission = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Anything to pick up first (a queued operation, a poisoning, a stop)
    // goes the common way, in order.
    if (signalled_.load(std::memory_order_acquire) || lane->poisoned() || stop_) return nullptr;
    take_seq_locked(*lane, *op, now);
    if (op->lane_ != lane) op->lane_ = lane;  // a reused operation has it
    // This caller waits: the next submission need not ring the engine thread.
    submission = ++submissions_;
    awaited_submission_.store(submission, std::memory_order_relaxed);
  }
  op->started_ = now;
  const Direct direct = run_direct(*lane, op, now);
  if (direct == Direct::completed) {
    record_finished(*op);
    op->work_completed_ = true;
    op->release_seq();
    return done;
  }
  if (direct == Direct::unavailable) start(op);
  Transport& t = lane->transport_;
  // A short budget: a late peer must not hold the caller (who may hold
  // locks of its own) longer than the engine's busy polling would.
  const auto budget = std::chrono::microseconds(tunables_.spin_us);
  auto last_progress = now;
  // Completions drive the operation (on_complete posts what follows);
  // progress() matters after one, and while a failed operation drains.
  bool progressed = direct == Direct::adopted;
  bool idle_from_next_poll = false;
  for (;;) {
    if (progressed || op->error()) {
      try {
        op->progress(t);
      } catch (...) {
        op->abort(t, std::current_exception());
      }
    }
    progressed = false;
    test_requests(progressed);
    if (op->done() && !op->error() && op->pending_ == 0 && op->computing_ == 0 && spawned_.empty())
      break;
    // No clock reading while completions come: the budget without progress
    // runs from the first idle poll after them.
    if (progressed) {
      idle_from_next_poll = true;
      continue;
    }
    now = Clock::now();
    if (std::exchange(idle_from_next_poll, false)) last_progress = now;
    if (op->error() || signalled_.load(std::memory_order_relaxed) ||
        !pause(now - last_progress, tested_, budget)) {
      // A failure, a peer that takes its time, or something else to pick up
      // (another thread's submission): the operation goes on as if
      // submitted, with a Work of its own.
      {
        std::lock_guard<std::mutex> lock(mutex_);
        bind_work_locked(lane, *op, options.label, std::move(details), submission);
      }
      publish_counts(now);
      const WorkPtr work = op->work_;
      wake_engine(false);  // its caller may not wait
      return work;
    }
  }
  // Completed within the call: no Work of its own (a reused one stays).
  op->work_completed_ = true;
  record_finished(*op);
  active_.erase(std::find(active_.begin(), active_.end(), op));
  op->release_seq();
  return done;
}

Engine::Direct Engine::run_direct(Lane& lane, const std::shared_ptr<Operation>& op,
                                  Clock::time_point started) {
  // Traced runs show every request; a prologue or a dependency means start().
  if (trace_.is_open() || op->prologue_ || op->after_) return Direct::unavailable;
  Transport& t = lane.transport_;
  DirectExchange x;
  try {
    if (!op->begin_direct(t, x)) return Direct::unavailable;
  } catch (...) {
    adopt_direct(op, x, std::current_exception());
    return Direct::adopted;
  }
  // Each request tested in turn (eager sends are complete at once): an
  // MPI_Test runs MPI's progress once when its request is not complete.
  // The same back-off and budget as run_now's.
  const auto budget = std::chrono::microseconds(tunables_.spin_us);
  bool failed = false, moved_since_continue = false;
  auto last_progress = started;
  bool idle_from_next_poll = false;
  for (;;) {
    bool moved = false;
    for (int k = 0; k < x.count; ++k) {
      DirectExchange::Request& r = x.requests[k];
      if (r.completed) continue;
      int flag = 0;
      r.error = MPI_Test(&r.request, &flag, r.send ? MPI_STATUS_IGNORE : &r.status);
      if (r.error != MPI_SUCCESS && flag == 0) {
        // MPI_Test itself failed: the request stays MPI's, parked in the
        // table (as after an MPI_Testsome failure, the lane is poisoned).
        const int rc = std::exchange(r.error, MPI_SUCCESS);
        adopt_direct(op, x);
        poison(op->lane_, detail::concat(op->name(), " #", op->seq(),
                                         ": MPI_Test failed: ", mpi_error_string(rc)));
        return Direct::adopted;
      }
      if (flag == 0) continue;
      r.request = MPI_REQUEST_NULL;  // MPI freed it
      r.completed = moved = moved_since_continue = true;
      failed = failed || r.error != MPI_SUCCESS;
    }
    if (failed) break;
    // The operation goes on once every receive completed (sends need not
    // have: a send that waits for the peer's receive must not stop it).
    if (moved_since_continue && x.all_completed(false)) {
      moved_since_continue = false;
      Operation::DirectStep step;
      try {
        step = op->continue_direct(t, x);
      } catch (...) {
        adopt_direct(op, x, std::current_exception());
        return Direct::adopted;
      }
      if (step == Operation::DirectStep::finished) {
        RELAXCC_ENFORCE(x.all_completed(true), InternalError, op->name(),
                        ": a direct exchange finished with sends pending");
        for (int k = 0; k < x.count; ++k) count_direct(lane, x, k);
        return Direct::completed;
      }
      if (step == Operation::DirectStep::refused) break;
      moved = true;  // more: test at once what it posted
    }
    if (moved) {
      idle_from_next_poll = true;
      continue;
    }
    const auto now = Clock::now();
    if (std::exchange(idle_from_next_poll, false)) last_progress = now;
    if (signalled_.load(std::memory_order_relaxed) || !pause(now - last_progress, true, budget))
      break;
  }
  adopt_direct(op, x);
  return Direct::adopted;
}

void Engine::count_direct(Lane& lane, const DirectExchange& x, int k) {
  const DirectExchange::Request& r = x.requests[k];
  LaneCounters& c = lane.counters_;
  const uint64_t bytes = r.send ? r.bytes : x.received(k);
  LaneCounters::add(r.send ? c.bytes_sent : c.bytes_received, bytes);
  LaneCounters::add(r.send ? c.sent_to[x.peer] : c.received_from[x.peer], bytes);
}

void Engine::adopt_direct(const std::shared_ptr<Operation>& op, DirectExchange& x,
                          std::exception_ptr error) {
  Transport& t = op->lane_->transport_;
  activate(op);
  for (int k = 0; k < x.count; ++k) {
    DirectExchange::Request& r = x.requests[k];
    if (r.completed) continue;
    const int index = add_request(*op, r.slot, std::exchange(r.request, MPI_REQUEST_NULL), r.bytes,
                                  x.peer, r.send, !r.send);
    pending_[index].cancellable = !r.send;
  }
  try {
    op->leave_direct(t);
  } catch (...) {
    if (!error) error = std::current_exception();
  }
  // A failure aborts the operation where it happened, before the
  // completions that follow reach it (as on the protocol's own path).
  if (error) {
    try {
      op->abort(t, error);
    } catch (...) {
      poison(op->lane_, detail::concat(op->name(), " #", op->seq(), ": abort failed: ",
                                       abort_cause(std::current_exception()).reason));
    }
  }
  // Completed requests as test_requests hands them over; the table counted
  // the others' sends when they moved in.
  for (int k = 0; k < x.count; ++k) {
    const DirectExchange::Request& r = x.requests[k];
    if (!r.completed) continue;
    if (r.send || r.consumed) count_direct(*op->lane_, x, k);
    if (!r.consumed) {
      // complete_request counts what it receives.
      complete_request(Pending{op.get(), r.slot, r.bytes, x.peer, r.send, !r.send, {}}, r.status,
                       r.error);
    }
  }
}

void Engine::poison(const std::shared_ptr<Lane>& lane, const std::string& reason,
                    bool notify_peers) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!poison_locked(lane, reason, notify_peers)) return;
  }
  cv_.notify_all();
}

bool Engine::poison_locked(const std::shared_ptr<Lane>& lane, const std::string& reason,
                           bool notify_peers) {
  if (lane->poisoned()) return false;
  lane->poison_reason_ = reason;
  lane->notify_peers_ = notify_peers;
  lane->poisoned_.store(true);
  to_poison_.push_back(lane);
  signalled_.store(true, std::memory_order_release);
  RELAXCC_LOG(warn, "communicator poisoned: ", reason);
  return true;
}

std::string Engine::poison_on_timeout(const std::shared_ptr<Lane>& lane, const Work& work,
                                      const std::string& reason) {
  auto report = std::make_shared<TimeoutReport>();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (lane->poisoned())
      return detail::concat("the communicator was poisoned before (", lane->poison_reason_, ")");
    lane->timed_out_ = &work;
    lane->timeout_report_ = report;
    poison_locked(lane, reason, true);
  }
  cv_.notify_all();
  std::unique_lock<std::mutex> lock(report->mutex);
  report->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return report->ready; });
  return report->waiting.empty() ? std::string() : "waiting for: " + report->waiting;
}

std::shared_ptr<TimeoutReport> Engine::report_timeout(Lane& lane) {
  std::shared_ptr<TimeoutReport> report;
  const Work* work = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    report = std::exchange(lane.timeout_report_, nullptr);
    work = std::exchange(lane.timed_out_, nullptr);
  }
  if (!report) return nullptr;
  std::string waiting;
  for (const auto* ops : {&active_, &waiting_})
    for (const auto& op : *ops)
      if (op->lane_.get() == &lane && op->work_.get() == work) waiting = op->waiting_for();
  if (!waiting.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    lane.poison_reason_ += "; waiting for: " + waiting;
  }
  std::lock_guard<std::mutex> lock(report->mutex);
  report->waiting = std::move(waiting);
  return report;
}

CommStats Engine::stats(const Lane& lane) const {
  const LaneCounters& c = lane.counters_;
  CommStats stats;
  stats.bytes_sent = c.bytes_sent.load(std::memory_order_relaxed);
  stats.bytes_received = c.bytes_received.load(std::memory_order_relaxed);
  stats.operations = c.operations.load(std::memory_order_relaxed);
  stats.late_messages = c.late_messages.load(std::memory_order_relaxed);
  for (const auto& n : c.sent_to) stats.sent_to.push_back(n.load(std::memory_order_relaxed));
  for (const auto& n : c.received_from)
    stats.received_from.push_back(n.load(std::memory_order_relaxed));
  stats.requests_pending = lane.requests_pending_.load(std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& weak : lanes_) stats.engine_lanes += weak.expired() ? 0 : 1;
  }
  stats.engine_operations = active_count_.load(std::memory_order_relaxed);
  const TagWindows::Counts windows = lane.comms_->windows->counts();
  stats.group_windows = static_cast<int64_t>(windows.live + windows.retired);
  return stats;
}

int Engine::add_request(Operation& op, int64_t slot, MPI_Request req, size_t bytes, int peer,
                        bool send, bool recv) {
  int index;
  if (!free_slots_.empty()) {
    std::pop_heap(free_slots_.begin(), free_slots_.end(), std::greater<>());
    index = free_slots_.back();
    free_slots_.pop_back();
  } else {
    index = static_cast<int>(requests_.size());
    requests_.push_back(MPI_REQUEST_NULL);
    pending_.emplace_back();
    indices_.resize(requests_.size());
    statuses_.resize(requests_.size());
  }
  requests_[index] = req;
  slots_in_use_ = std::max(slots_in_use_, index + 1);
  pending_[index] = Pending{
      &op, slot, bytes, peer, send, recv, trace_.is_open() ? Clock::now() : Clock::time_point{}};
  ++num_pending_;
  ++op.pending_;
  op.lane_->requests_pending_.fetch_add(1, std::memory_order_relaxed);
  if (send) {
    LaneCounters& c = op.lane_->counters_;
    LaneCounters::add(c.bytes_sent, bytes);
    LaneCounters::add(c.sent_to[peer], bytes);
  }
  return index;
}

namespace {
int64_t micros(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}
}  // namespace

void Engine::test_requests(bool& progressed) {
  tested_ = num_pending_ > 0;
  if (num_pending_ == 0) return;
  int outcount = 0;
  // Open MPI's MPI_Testsome looks for completed requests before it runs its
  // progress, not after: a call that finds none looks once more, so a
  // request that its progress completed is found now, not an iteration later
  // (not where MPI's progress yields the CPU when idle: twice the yields).
  int rc = MPI_SUCCESS;
  const int tries = mpi_yields_.load(std::memory_order_relaxed) ? 1 : 2;
  for (int k = 0; k < tries && rc == MPI_SUCCESS && outcount == 0; ++k)
    rc =
        MPI_Testsome(slots_in_use_, requests_.data(), &outcount, indices_.data(), statuses_.data());
  if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
    const std::string reason = "MPI_Testsome failed: " + mpi_error_string(rc);
    std::vector<std::shared_ptr<Lane>> lanes;
    for (const auto& op : active_) lanes.push_back(op->lane_);
    for (const auto& lane : lanes) poison(lane, reason);
    abort_all(nullptr, reason);
    return;
  }
  if (outcount == MPI_UNDEFINED || outcount == 0) return;
  progressed = true;
  for (int k = 0; k < outcount; ++k) {
    const int index = indices_[k];
    const Pending p = pending_[index];
    // A copy: on_complete may post requests, and add_request may grow statuses_.
    const MPI_Status status = statuses_[k];
    const int err = rc == MPI_ERR_IN_STATUS ? status.MPI_ERROR : MPI_SUCCESS;
    requests_[index] = MPI_REQUEST_NULL;
    pending_[index] = Pending{};
    free_slots_.push_back(index);
    std::push_heap(free_slots_.begin(), free_slots_.end(), std::greater<>());
    --num_pending_;
    --p.op->pending_;
    p.op->lane_->requests_pending_.fetch_sub(1, std::memory_order_relaxed);
    complete_request(p, status, err);
  }
  while (slots_in_use_ > 0 && requests_[slots_in_use_ - 1] == MPI_REQUEST_NULL) --slots_in_use_;
}

void Engine::complete_request(const Pending& p, const MPI_Status& status, int err) {
  if (p.recv && err == MPI_SUCCESS) {
    int cancelled = 0;
    MPI_Test_cancelled(&status, &cancelled);
    int got = 0;
    if (!cancelled) MPI_Get_count(&status, MPI_BYTE, &got);
    LaneCounters& c = p.op->lane_->counters_;
    LaneCounters::add(c.bytes_received, static_cast<uint64_t>(got));
    LaneCounters::add(c.received_from[p.peer], static_cast<uint64_t>(got));
  }
  if (trace_.is_open() && (p.send || p.recv))
    trace_event(p.send ? "send" : "recv", "transport", p.send ? 1 : 2, p.posted,
                detail::concat("\"peer\":", p.peer, ",\"bytes\":", p.bytes, ",\"op\":\"",
                               p.op->name(), "\",\"seq\":", p.op->seq()));
  try {
    p.op->on_complete(p.op->lane_->transport_, p.slot, status, err);
  } catch (...) {
    // An abort that fails (a send it posts throws) must not lose the other
    // completions of this batch: their requests are freed already.
    try {
      p.op->abort(p.op->lane_->transport_, std::current_exception());
    } catch (...) {
      poison(p.op->lane_, detail::concat(p.op->name(), " #", p.op->seq(), ": abort failed: ",
                                         abort_cause(std::current_exception()).reason));
    }
  }
  // The transport gave up on a peer (a lost connection, a dead process):
  // nothing more on this lane can be trusted to complete.
  if (err != MPI_SUCCESS && p.peer >= 0)
    poison(p.op->lane_,
           detail::concat(p.op->name(), " #", p.op->seq(), ": transport error with rank ", p.peer,
                          ": ", mpi_error_string(err)));
}

void Engine::retire_finished() {
  // A finished protocol completes its Work at once; the operation itself (and
  // the buffers it holds) stays until the transport released every request,
  // which after a poisoning may be never ("parked").
  for (const auto& op : active_) {
    if (op->work_completed_ || !op->done() || op->computing_ > 0) continue;
    op->work_completed_ = true;
    if (!op->work_) continue;  // spawned by an operation
    record_finished(*op);
    op->report(*op->work_);
    op->work_->complete(op->error());
  }
  // Dropped operations release their tags now (one kept for reuse lives on).
  auto it =
      std::remove_if(active_.begin(), active_.end(), [](const std::shared_ptr<Operation>& op) {
        const bool drop = op->work_completed_ && op->pending_ == 0 && op->computing_ == 0;
        if (drop) op->release_seq();
        return drop;
      });
  active_.erase(it, active_.end());
}

void Engine::record_finished(const Operation& op) {
  LaneCounters::add(op.lane_->counters_.operations, 1);
  if (trace_.is_open())
    trace_event(op.name(), "op", 0, op.started_,
                detail::concat("\"seq\":", op.seq(), ",\"priority\":", op.priority(),
                               ",\"queued_us\":", micros(op.started_) - micros(op.submitted_),
                               ",\"ok\":", op.error() ? "false" : "true"));
}

void Engine::trace_event(const std::string& name, const char* cat, int tid, Clock::time_point start,
                         const std::string& args) {
  if (!trace_.is_open()) return;
  trace_ << (trace_first_ ? "" : ",\n") << "{\"name\":\"" << name << "\",\"cat\":\"" << cat
         << "\",\"ph\":\"X\",\"pid\":" << trace_pid_ << ",\"tid\":" << tid
         << ",\"ts\":" << micros(start) << ",\"dur\":" << micros(Clock::now()) - micros(start)
         << ",\"args\":{" << args << "}}";
  trace_first_ = false;
}

bool Engine::fail_if_poisoned(Operation& op) {
  if (!op.lane_->poisoned()) return false;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    reason = op.lane_->poison_reason_;
  }
  op.set_error(std::make_exception_ptr(CommunicatorPoisoned(
      detail::concat(op.name(), " #", op.seq(), ": the communicator is poisoned (", reason, ")"),
      __FILE__, __LINE__)));
  op.work_->complete(op.error());
  return true;
}

void Engine::fail_waiting(const Lane* lane, const std::string& reason) {
  auto it = std::stable_partition(waiting_.begin(), waiting_.end(), [&](const auto& op) {
    return lane != nullptr && op->lane_.get() != lane;
  });
  for (auto failed = it; failed != waiting_.end(); ++failed) {
    Operation& op = **failed;
    op.set_error(std::make_exception_ptr(
        CommunicationError(detail::concat(op.name(), " #", op.seq(), " did not start: ", reason),
                           __FILE__, __LINE__)));
    op.work_->complete(op.error());
  }
  waiting_.erase(it, waiting_.end());
}

Operation& Engine::activate(const std::shared_ptr<Operation>& op) {
  auto pos = std::find_if(active_.begin(), active_.end(),
                          [&](const auto& other) { return other->priority() < op->priority(); });
  return **active_.insert(pos, op);
}

void Engine::start(const std::shared_ptr<Operation>& op) {
  // A failed dependency: the operation fails too, and tells its peers.
  std::exception_ptr failed;
  if (op->after_) {
    if (std::exception_ptr e = op->after_->exception()) {
      failed = std::make_exception_ptr(CommunicationError(
          detail::concat(op->name(), " #", op->seq(), ": a stage it runs after failed: ",
                         op->after_->description(), ": ", abort_cause(e).reason),
          __FILE__, __LINE__));
    }
    op->after_.reset();
  }
  Operation& ref = activate(op);
  Transport& t = ref.lane_->transport_;
  try {
    if (failed) {
      ref.start_failed(t, failed);
    } else {
      if (ref.prologue_) std::exchange(ref.prologue_, nullptr)();
      ref.start(t);
    }
  } catch (...) {
    ref.abort(t, std::current_exception());
  }
}

void Engine::abort_all(const Lane* lane, const std::string& reason) {
  fail_waiting(lane, detail::concat("the communicator is poisoned (", reason, ")"));
  for (const auto& op : active_) {
    if ((op->done() && op->pending_ == 0) || (lane != nullptr && op->lane_.get() != lane)) continue;
    auto err = std::make_exception_ptr(CommunicatorPoisoned(
        detail::concat(op->name(), " #", op->seq(), " aborted: the communicator is poisoned (",
                       reason, ")"),
        __FILE__, __LINE__));
    try {
      op->abort(op->lane_->transport_, err);
    } catch (...) {
      RELAXCC_LOG(error, "abort of ", op->name(), " #", op->seq(), " failed");
    }
  }
}

void Engine::inspect_stalls() {
  const auto now = Clock::now();
  if (log_enabled(LogLevel::debug) && !active_.empty()) {
    for (const auto& op : active_)
      RELAXCC_LOG(debug, "engine: ", op->name(), " #", op->seq(), " active, done=", op->done(),
                  " pending requests=", op->pending_, " waiting for: ", op->waiting_for());
  }
  const auto limit = std::chrono::milliseconds(tunables_.stall_warning_ms);
  for (const auto& op : active_) {
    if (op->stall_reported_ || op->done() || op->background() || now - op->started_ < limit)
      continue;
    op->stall_reported_ = true;
    RELAXCC_LOG(warn, "stall: ", op->name(), " #", op->seq(), " pending for ",
                std::chrono::duration_cast<std::chrono::seconds>(now - op->started_).count(),
                " s; waiting for: ", op->waiting_for());
  }
}

bool Engine::drives_progress_here() {
  return tokens_held > 0;
}

bool Engine::iterate(Clock::time_point now) {
  std::vector<std::shared_ptr<Lane>> apply_poison;
  bool released = false;
  std::vector<Doorbell::Computed> computed;
  // signalled_ is set under mutex_ whenever the queue, stop_, a dependency or
  // the poison flag changes, so a clear flag means there is nothing to pick up.
  if (signalled_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mutex_);
    incoming_.swap(queue_);
    signalled_.store(false, std::memory_order_relaxed);
    released = std::exchange(doorbell_->released, false);
    computed.swap(doorbell_->computed);
    apply_poison.swap(to_poison_);
    if (stop_) {
      signalled_.store(true,
                       std::memory_order_relaxed);  // keep checking the deadline under the lock
      if (shutdown_deadline_ == Clock::time_point{}) {
        // Operations still running get time to finish; requests parked by a
        // poisoning (their operations already done) only a short grace.
        const bool running = std::any_of(active_.begin(), active_.end(), [](const auto& op) {
          return !op->done() && !op->background() && !op->lane_->poisoned();
        });
        shutdown_deadline_ =
            Clock::now() +
            (running ? std::chrono::milliseconds(std::min<int64_t>(tunables_.timeout_ms, 10000))
                     : std::chrono::milliseconds(200));
      }
    }
  }
  for (const auto& lane : apply_poison) {
    const std::shared_ptr<TimeoutReport> report = report_timeout(*lane);
    if (lane->notify_peers_) send_notices(*lane);
    abort_all(lane.get(), lane->poison_reason_);
    // Answered once the operation stopped: its caller may then free what
    // the operation used.
    if (report) {
      {
        std::lock_guard<std::mutex> lock(report->mutex);
        report->ready = true;
      }
      report->cv.notify_all();
    }
  }
  // Notices are picked up every millisecond (not before each new operation:
  // an MPI_Test per small operation costs more than its latency allows); an
  // operation that starts on a lane poisoned elsewhere fails when the notice
  // arrives.
  if (now - last_notice_poll_ > kNoticePoll) poll_notices();
  // Operations arrive in sequence order: they take their turns now, and
  // start now unless they wait for a dependency.
  for (auto& op : incoming_) {
    op->started_ = now;
    if (fail_if_poisoned(*op)) continue;
    if (op->after_ && !op->released_.load(std::memory_order_acquire))
      waiting_.push_back(op);
    else
      start(op);
  }
  if (released) {
    auto it = std::stable_partition(waiting_.begin(), waiting_.end(), [](const auto& op) {
      return !op->released_.load(std::memory_order_acquire);
    });
    std::vector<std::shared_ptr<Operation>> ready(std::make_move_iterator(it),
                                                  std::make_move_iterator(waiting_.end()));
    waiting_.erase(it, waiting_.end());
    if (!ready.empty()) poll_notices();
    for (const auto& op : ready) {
      op->started_ = now;
      if (!fail_if_poisoned(*op)) start(op);
    }
  }
  for (auto& c : computed) {
    --c.op->computing_;
    Transport& t = c.op->lane_->transport_;
    try {
      c.op->on_computed(t, c.slot, std::move(c.error));
    } catch (...) {
      c.op->abort(t, std::current_exception());
    }
  }
  const bool poll_background = now - last_background_poll_ >= kBackgroundPoll;
  if (poll_background) last_background_poll_ = now;
  for (size_t i = 0; i < active_.size(); ++i) {
    Operation& op = *active_[i];
    if (op.background() && op.pending_ == 0 && !poll_background) continue;
    Transport& t = op.lane_->transport_;
    try {
      op.progress(t);
    } catch (...) {
      op.abort(t, std::current_exception());
    }
  }
  for (auto& op : std::exchange(spawned_, {})) start(op);
  bool progressed = !incoming_.empty() || released || !computed.empty();
  incoming_.clear();
  test_requests(progressed);
  retire_finished();

  if (now - last_inspection_ > std::chrono::seconds(1)) {
    last_inspection_ = now;
    inspect_stalls();
    expire_closed_lanes(now);
  }
  publish_counts(now);
  return progressed;
}

void Engine::publish_counts(Clock::time_point now) {
  // Background operations without requests pending are polled every
  // kBackgroundPoll, not counted as active.
  int active = 0, parked = 0, background = 0;
  for (const auto& op : active_) {
    if (op->background() && op->pending_ == 0) {
      ++background;
      continue;
    }
    ++active;
    parked += op->work_completed_ ? 1 : 0;
  }
  active_count_.store(active, std::memory_order_relaxed);
  parked_.store(parked, std::memory_order_relaxed);
  background_count_.store(background, std::memory_order_relaxed);
  notices_pending_.store(!notice_sends_.empty() && now < notices_sent_at_ + kNoticeSendLimit,
                         std::memory_order_relaxed);
}

bool Engine::pause(Clock::duration idle, bool tested, Clock::duration yield_until) const {
  const bool shared = backoff_.load(std::memory_order_relaxed) == Backoff::sleep;
  if (!shared && idle < std::chrono::microseconds(tunables_.spin_us)) return true;
  if (idle >= yield_until) return false;
  // MPI_Testsome yielded already when it found nothing.
  if (!(shared && tested && mpi_yields_.load(std::memory_order_relaxed))) sched_yield();
  return true;
}

int64_t Engine::next_sleep(int64_t sleep_us) const {
  const bool only_parked =
      parked_.load(std::memory_order_relaxed) == active_count_.load(std::memory_order_relaxed);
  const int64_t cap = only_parked ? std::max<int64_t>(kParkedSleepUs, tunables_.max_sleep_us)
                                  : tunables_.max_sleep_us;
  return sleep_us == 0 ? std::min<int64_t>(4, cap) : std::min<int64_t>(sleep_us * 2, cap);
}

bool Engine::wait_for_work() {
  std::unique_lock<std::mutex> lock(mutex_);
  uint64_t seen = submissions_;
  auto quiet_since = Clock::now();
  for (;;) {
    if (stop_) return !queue_.empty() || active_count_.load(std::memory_order_relaxed) > 0;
    const bool driven = drivers_.load(std::memory_order_acquire) > 0;
    if (!driven && (signalled_.load(std::memory_order_acquire) ||
                    active_count_.load(std::memory_order_relaxed) > 0)) {
      state_.store(State::running, std::memory_order_relaxed);
      return true;
    }
    const auto now = Clock::now();
    if (submissions_ != seen) {
      seen = submissions_;
      quiet_since = now;
    }
    if (!driven && (notices_pending_.load(std::memory_order_relaxed) ||
                    background_count_.load(std::memory_order_relaxed) > 0)) {
      // Idle with this rank's own poison notices to push out (for at most
      // kNoticeSendLimit) or background operations: one iteration every
      // millisecond.
      state_.store(State::watching, std::memory_order_relaxed);
      cv_.wait_for(lock, std::chrono::milliseconds(1));
      if (drivers_.load(std::memory_order_acquire) > 0 || stop_) continue;
      state_.store(State::running, std::memory_order_relaxed);
      return true;
    }
    if (driven || now - quiet_since < kWatchFor) {
      state_.store(State::watching, std::memory_order_relaxed);
      cv_.wait_for(lock, kWatchInterval);
    } else {
      state_.store(State::idle, std::memory_order_relaxed);
      cv_.wait(lock);
    }
  }
}

void Engine::loop() {
  // Short back-off sleeps must stay short: the default 50 us timer slack
  // would stretch every one of them.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  const auto spin = std::chrono::microseconds(tunables_.spin_us);
  const auto yield_for = std::chrono::microseconds(tunables_.yield_us);
  bool shut_down = false;
  while (!shut_down && wait_for_work()) {
    // Run until there is nothing to do or a caller drives (after a stop:
    // until done or the shutdown deadline).
    auto now = Clock::now();
    auto last_progress = now;
    int64_t sleep_us = 0;
    for (;; now = Clock::now()) {
      bool progressed = false;
      bool stopping = false;
      bool tested = false;
      {
        TokenHold hold(token_, token_holder_);
        if (hold) {
          progressed = iterate(now);
          tested = tested_;
          stopping = shutdown_deadline_ != Clock::time_point{};
          if (stopping && Clock::now() > shutdown_deadline_) {
            drain_on_shutdown();
            shut_down = true;
            break;
          }
        }
      }
      if (!stopping && drivers_.load(std::memory_order_acquire) > 0) break;
      if (!progressed && active_count_.load(std::memory_order_relaxed) == 0) break;
      if (progressed) {
        last_progress = now;
        sleep_us = 0;
        continue;
      }
      // Shared CPUs: yields only for spin_us (computation on this CPU comes
      // first); own CPUs: yields up to yield_us.
      const bool shared = backoff_.load(std::memory_order_relaxed) == Backoff::sleep;
      if (pause(now - last_progress, tested, shared ? spin : std::max(spin, yield_for))) continue;
      sleep_us = next_sleep(sleep_us);
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait_for(lock, std::chrono::microseconds(sleep_us), [&] {
          return stop_ || !queue_.empty() || doorbell_->released || !to_poison_.empty() ||
                 !doorbell_->computed.empty() || drivers_.load(std::memory_order_relaxed) > 0;
        });
      }
      if (trace_.is_open())
        if (TokenHold hold(token_, token_holder_); hold)
          trace_event("sleep", "engine", 3, now, detail::concat("\"requested_us\":", sleep_us));
    }
  }
  // Nobody drives any more (the engine is being destroyed): take the token.
  for (;;) {
    TokenHold hold(token_, token_holder_);
    if (!hold) {
      sched_yield();
      continue;
    }
    fail_waiting(nullptr, "the communicator was destroyed before the Work it runs after completed");
    release_listeners(true);
    break;
  }
}

bool Engine::drive(EngineWork& work, Clock::time_point deadline) {
  // A completion callback that waits (callbacks must not): the engine cannot
  // progress under it.
  if (holds_token()) return work.sleep_until(deadline);
  drivers_.fetch_add(1, std::memory_order_acq_rel);
  for (uint64_t seen = awaited_submission_.load(std::memory_order_relaxed);
       seen < work.submission() && !awaited_submission_.compare_exchange_weak(
                                       seen, work.submission(), std::memory_order_relaxed);) {
  }
  struct Leave {
    Engine& engine;
    ~Leave() {
      // seq_cst, as in submit() and ring_released(): either they see this
      // driver gone and ring, or this sees their signal.
      if (engine.drivers_.fetch_sub(1, std::memory_order_seq_cst) != 1) return;
      // The last driver leaves: the engine thread takes over what is still
      // in flight (not requests parked after completion: it finds those
      // when it watches).
      if (engine.signalled_.load(std::memory_order_seq_cst) ||
          engine.active_count_.load(std::memory_order_relaxed) >
              engine.parked_.load(std::memory_order_relaxed))
        engine.wake_engine(false);
    }
  } leave{*this};
  const auto yield_for = std::max(std::chrono::microseconds(tunables_.spin_us),
                                  std::chrono::microseconds(tunables_.yield_us));
  auto now = Clock::now();
  auto last_progress = now;
  int64_t sleep_us = 0;
  for (;; now = Clock::now()) {
    bool progressed = false;
    bool tested = false;
    if (TokenHold hold(token_, token_holder_); hold) {
      progressed = iterate(now);
      tested = tested_;
      // Requests of finished operations (a cancelled receive) complete on the
      // next test: collect them now rather than leave them to the engine.
      if (work.is_completed() && parked_.load(std::memory_order_relaxed) > 0) iterate(now);
    }
    if (work.is_completed()) return true;
    if (now >= deadline) return false;
    if (progressed) {
      last_progress = now;
      sleep_us = 0;
      continue;
    }
    if (pause(now - last_progress, tested, yield_for)) continue;
    sleep_us = next_sleep(sleep_us);
    work.sleep_until(std::min(deadline, now + std::chrono::microseconds(sleep_us)));
  }
}

void Engine::wake_engine(bool only_if_idle) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const State state = state_.load(std::memory_order_relaxed);
    if (state == State::running || (only_if_idle && state != State::idle)) return;
  }
  cv_.notify_all();
}

void Engine::wake_for_callbacks() {
  // Its Work may have no waiter: the engine thread must run it.
  if (drivers_.load(std::memory_order_acquire) == 0) wake_engine(false);
}

void Engine::expire_closed_lanes(Clock::time_point now) {
  std::vector<std::shared_ptr<Lane>> expired;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto keep =
        std::remove_if(closing_.begin(), closing_.end(), [&](const std::weak_ptr<Lane>& weak) {
          auto lane = weak.lock();
          if (!lane) return true;  // no operation holds it any more
          if (now < lane->close_deadline_) return false;
          expired.push_back(std::move(lane));
          return true;
        });
    closing_.erase(keep, closing_.end());
  }
  for (const auto& lane : expired)
    poison(lane, "the communicator was destroyed with operations in flight", false);
  release_listeners(false);
}

// ---- Poison notices ------------------------------------------------------------

namespace {
bool post_listener(MPI_Comm comm, PoisonNotice* notice, MPI_Request* request) {
  *notice = PoisonNotice{};
  const int rc =
      MPI_Irecv(notice, sizeof(PoisonNotice), MPI_BYTE, MPI_ANY_SOURCE, kNoticeTag, comm, request);
  if (rc == MPI_SUCCESS) return true;
  RELAXCC_LOG(warn, "cannot listen for poison notices: ", mpi_error_string(rc));
  *request = MPI_REQUEST_NULL;
  return false;
}
}  // namespace

void Engine::poll_notices() {
  last_notice_poll_ = Clock::now();
  std::vector<std::shared_ptr<CommPair>> fresh;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fresh.swap(to_listen_);
  }
  for (auto& comms : fresh) {
    const bool known = std::any_of(listeners_.begin(), listeners_.end(),
                                   [&](const auto& l) { return l->comms == comms; });
    if (known || comms->size < 2) continue;
    auto listener = std::make_unique<Listener>();
    listener->comms = std::move(comms);
    if (post_listener(listener->comms->coll, &listener->notice, &listener->request))
      listeners_.push_back(std::move(listener));
  }
  for (auto& l : listeners_) {
    // Several notices may be waiting.
    while (l->request != MPI_REQUEST_NULL) {
      int flag = 0;
      MPI_Status status;
      const int rc = MPI_Test(&l->request, &flag, &status);
      if (rc != MPI_SUCCESS) {
        // Failed for good (MPI keeps reporting the same request): listen anew.
        RELAXCC_LOG(warn,
                    "poison-notice receive failed (posting a new one): ", mpi_error_string(rc));
        MPI_Request_free(&l->request);
        post_listener(l->comms->coll, &l->notice, &l->request);
        break;
      }
      if (!flag) break;  // (a completed request is now MPI_REQUEST_NULL)
      on_notice(*l->comms, l->notice, status.MPI_SOURCE);
      post_listener(l->comms->coll, &l->notice, &l->request);
    }
  }
  test_notice_sends();
}

void Engine::test_notice_sends() {
  // A buffer goes only with its request (an MPI_Test error leaves it
  // posted: it is freed, and the notice to that peer is lost).
  auto done = std::remove_if(notice_sends_.begin(), notice_sends_.end(), [](NoticeSend& n) {
    int flag = 0;
    if (MPI_Test(&n.request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS &&
        n.request != MPI_REQUEST_NULL)
      MPI_Request_free(&n.request);
    return n.request == MPI_REQUEST_NULL;
  });
  notice_sends_.erase(done, notice_sends_.end());
}

void Engine::on_notice(const CommPair& comms, PoisonNotice notice, int source) {
  if (notice.magic != kHeaderMagic) {
    RELAXCC_LOG(warn, "ignored a corrupt poison notice from rank ", source);
    return;
  }
  notice.reason[sizeof(notice.reason) - 1] = '\0';
  std::vector<std::shared_ptr<Lane>> hit;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& weak : lanes_) {
      auto lane = weak.lock();
      if (lane && lane->comms_.get() == &comms && lane->id_ == notice.lane && notice.origin >= 0 &&
          notice.origin < lane->size_ && notice.origin != lane->rank_ &&
          lane->comm_rank(notice.origin) == source && lane->window(notice.origin) == notice.window)
        hit.push_back(std::move(lane));
    }
  }
  for (const auto& lane : hit)
    poison(lane, detail::concat("by rank ", notice.origin, ": ", notice.reason), false);
}

void Engine::send_notices(const Lane& lane) {
  notices_sent_at_ = Clock::now();
  PoisonNotice base;
  base.lane = lane.id_;
  base.origin = lane.rank_;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    base.set_reason(lane.poison_reason_);
  }
  for (int r = 0; r < lane.size_; ++r) {
    if (r == lane.rank_) continue;
    // Per peer: the window differs.
    auto notice = std::make_shared<PoisonNotice>(base);
    notice->window = lane.window(r);
    NoticeSend send{notice, MPI_REQUEST_NULL};
    const int rc = MPI_Isend(notice.get(), sizeof(PoisonNotice), MPI_BYTE, lane.comm_rank(r),
                             kNoticeTag, lane.comms_->coll, &send.request);
    if (rc == MPI_SUCCESS)
      notice_sends_.push_back(std::move(send));
    else
      RELAXCC_LOG(warn, "cannot send a poison notice to rank ", r, ": ", mpi_error_string(rc));
  }
}

void Engine::release_listeners(bool all) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    lanes_.erase(
        std::remove_if(lanes_.begin(), lanes_.end(), [](const auto& w) { return w.expired(); }),
        lanes_.end());
    if (all) to_listen_.clear();
  }
  if (mpi_finalized()) {
    // Communicators that outlived MPI_Finalize (the application's error):
    // no MPI call any more; the buffers stay (leaked).
    if (all) {
      new std::vector<std::unique_ptr<Listener>>(std::move(listeners_));
      new std::vector<NoticeSend>(std::move(notice_sends_));
    }
    return;
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(200);
  auto unused = std::stable_partition(listeners_.begin(), listeners_.end(), [&](const auto& l) {
    return !all && l->comms.use_count() > 1;
  });
  for (auto it = unused; it != listeners_.end(); ++it) {
    Listener& l = **it;
    if (l.request == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&l.request);
    int flag = 0;
    while (MPI_Test(&l.request, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag &&
           Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (!flag) {
      RELAXCC_LOG(warn, "a poison-notice receive did not cancel; its buffer is kept (leaked)");
      new std::unique_ptr<Listener>(
          std::move(*it));  // intentional leak: the transport may still write it
    }
  }
  listeners_.erase(unused, listeners_.end());
  if (all) {
    while (!notice_sends_.empty() && Clock::now() < deadline) {
      test_notice_sends();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (!notice_sends_.empty())
      new std::vector<NoticeSend>(std::move(notice_sends_));  // intentional leak: sends in flight
  }
}

void Engine::drain_on_shutdown() {
  if (mpi_finalized()) {
    RELAXCC_LOG(error, "a communicator outlived MPI_Finalize with ", active_.size(),
                " operation(s) in flight; they are leaked");
    new std::vector<std::shared_ptr<Operation>>(std::move(active_));  // intentional leak
    return;
  }
  abort_all(nullptr, "the communicator was destroyed with operations in flight");
  const auto deadline = Clock::now() + std::chrono::milliseconds(200);
  while (num_pending_ > 0 && Clock::now() < deadline) {
    bool progressed = false;
    test_requests(progressed);
    if (!progressed) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  retire_finished();
  if (!active_.empty()) {
    RELAXCC_LOG(error, active_.size(),
                " operation(s) still hold posted requests at shutdown; "
                "their buffers are kept alive (leaked) so the transport never writes freed memory");
    new std::vector<std::shared_ptr<Operation>>(std::move(active_));  // intentional leak
  }
}

// ---- EngineWork --------------------------------------------------------------

std::string EngineWork::describe() const {
  return detail::concat(name_, " #", seq_, detail::of_label(label_), " (tag ", tag_, ", ",
                        details_ ? details_() : std::string(), ")");
}

bool EngineWork::await(Clock::time_point deadline) {
  auto engine = engine_.lock();
  return engine ? engine->drive(*this, deadline) : block_until(deadline);
}

void EngineWork::on_callback_queued() {
  if (auto engine = engine_.lock()) engine->wake_for_callbacks();
}

std::string EngineWork::on_timeout(const std::string& reason) {
  auto engine = engine_.lock();
  auto lane = lane_.lock();
  return engine && lane ? engine->poison_on_timeout(lane, *this, reason) : std::string();
}

}  // namespace relaxcc::mpi
