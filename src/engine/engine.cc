#include "src/engine/engine.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <sstream>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "relaxcc/logging.h"
#include "src/engine/engine_detail.h"
#include "src/engine/engine_work.h"
#include "src/engine/tunables_check.h"

namespace relaxcc::engine {

// ---- Engine ----------------------------------------------------------------

namespace {

// `t`, once check_tunables passed: an engine starts nothing on values it
// would not accept.
Tunables checked(Tunables t) {
  check_tunables(t);
  return t;
}

}  // namespace

Engine::Engine(Tunables tunables, Polling polling, std::shared_ptr<Transport> transport)
    : tunables_(checked(std::move(tunables))),
      peer_timeout_(tunables_.peer_timeout_ms),
      backoff_(polling.backoff),
      transport_(std::move(transport)),
      null_request_(transport_->null_request()),
      transport_yields_(transport_->yields_when_idle()),
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
        bell->notify();
      }) {
  if (transport_->event_fd() >= 0) doorbell_->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  trace_pid_ = transport_->job_rank();
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
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    signalled_.store(true, std::memory_order_release);
  }
  doorbell_->notify();
  thread_.join();
  if (trace_.is_open()) trace_ << "\n]\n";
}

void Doorbell::ring_released() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    released = true;
    signalled.store(true, std::memory_order_seq_cst);
  }
  // Callers that drive pick it up (and wake the engine thread when they leave).
  if (drivers.load(std::memory_order_seq_cst) == 0) notify();
}

Doorbell::~Doorbell() {
  if (wake_fd >= 0) ::close(wake_fd);
}

void Doorbell::notify() {
  cv.notify_all();
  if (wake_fd < 0) return;
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof one);
}

Engine::Slept Engine::sleep_on_events(std::unique_lock<std::mutex>& lock, Clock::duration timeout) {
  const int event_fd = transport_->event_fd();
  if (event_fd < 0 || doorbell_->wake_fd < 0) return Slept::unsupported;
  {
    // arm() is the token holder's; a caller that drives holds it instead.
    TokenHold hold(token_, token_holder_);
    if (!hold) return Slept::unsupported;
    if (!transport_->arm()) return Slept::events;
  }
  lock.unlock();
  pollfd fds[2] = {{event_fd, POLLIN, 0}, {doorbell_->wake_fd, POLLIN, 0}};
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
  const timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  const int n = ::ppoll(fds, 2, &ts, nullptr);
  // A ring after this read is seen when the caller looks under the lock.
  uint64_t rings = 0;
  const bool rung = (fds[1].revents & POLLIN) != 0 &&
                    ::read(doorbell_->wake_fd, &rings, sizeof rings) == sizeof rings;
  lock.lock();
  return n > 0 && rung && (fds[0].revents & POLLIN) == 0 ? Slept::rung : Slept::events;
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
  // a test per small operation costs more than its latency allows); an
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
    RequestPoster& t = c.op->lane_->poster_;
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
    RequestPoster& t = op.lane_->poster_;
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
  // test_some yielded already when it found nothing.
  if (!(shared && tested && transport_yields_)) sched_yield();
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
  uint64_t& seen = seen_submissions_;
  auto& quiet_since = quiet_since_;
  // After an idle notice poll the quiet period goes on; otherwise it starts.
  if (!idle_poll_) {
    seen = submissions_;
    quiet_since = Clock::now();
  }
  idle_poll_ = false;
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
    if (!driven &&
        now.time_since_epoch().count() - notices_polled_at_.load(std::memory_order_relaxed) >=
            Clock::duration(kIdleNoticePoll).count()) {
      // Watching for long without an iteration: one for the notices and
      // heartbeats (the quiet period goes on).
      state_.store(State::running, std::memory_order_relaxed);
      idle_poll_ = true;
      return true;
    }
    if (driven || now - quiet_since < kWatchFor) {
      state_.store(State::watching, std::memory_order_relaxed);
      // Without a caller driving: a message wakes the thread at once for an
      // iteration (the quiet period goes on).
      const Slept slept = driven ? Slept::unsupported : sleep_on_events(lock, kWatchInterval);
      if (slept == Slept::unsupported) cv_.wait_for(lock, kWatchInterval);
      if (slept == Slept::events && !stop_ && drivers_.load(std::memory_order_acquire) == 0) {
        state_.store(State::running, std::memory_order_relaxed);
        idle_poll_ = true;
        return true;
      }
    } else {
      // Idle: woken by work, or every kIdleNoticePoll for one iteration
      // that picks up the peers' poison notices (poisoned() turns true on
      // an idle rank too).
      // Over a transport with an event fd, a message (a notice, a peer's
      // operation) wakes it at once as well.
      state_.store(State::idle, std::memory_order_relaxed);
      Slept slept = sleep_on_events(lock, kIdleNoticePoll);
      if (slept == Slept::unsupported)
        slept = cv_.wait_for(lock, kIdleNoticePoll) == std::cv_status::timeout ? Slept::events
                                                                               : Slept::rung;
      if (slept == Slept::events && !stop_ && drivers_.load(std::memory_order_acquire) == 0) {
        state_.store(State::running, std::memory_order_relaxed);
        idle_poll_ = true;
        return true;
      }
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
        const auto rung = [&] {
          return stop_ || !queue_.empty() || doorbell_->released || !to_poison_.empty() ||
                 !doorbell_->computed.empty() || drivers_.load(std::memory_order_relaxed) > 0;
        };
        // On the transport's event fd, a completion ends the sleep at once:
        // it lasts kWatchInterval (for the operations' deadlines and
        // timeouts) instead of the back-off's.
        if (rung() || sleep_on_events(lock, kWatchInterval) == Slept::unsupported)
          cv_.wait_for(lock, std::chrono::microseconds(sleep_us), rung);
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
  doorbell_->notify();
}

void Engine::wake_for_callbacks() {
  // Its Work may have no waiter: the engine thread must run it.
  if (drivers_.load(std::memory_order_acquire) == 0) wake_engine(false);
}

void Engine::drain_on_shutdown() {
  if (transport_->closed()) {
    RELAXCC_LOG(error, "a communicator outlived its transport (", transport_->name(),
                " finalized) with ", active_.size(), " operation(s) in flight; they are leaked");
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

}  // namespace relaxcc::engine
