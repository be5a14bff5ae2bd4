#include "relaxcc/relaxed/async_average.h"

#include <cstring>
#include <utility>

#include "relaxcc/errors.h"
#include "relaxcc/logging.h"
#include "src/relaxed/float_access.h"
#include "src/relaxed/tensor_backend.h"

namespace relaxcc {

using Clock = std::chrono::steady_clock;

// The round in flight: its snapshot and the buffer being averaged.
struct AsyncModelAverager::Round {
  std::shared_ptr<std::vector<unsigned char>> snapshot, averaged;
  int64_t started_at = 0;  // step
};

AsyncModelAverager::AsyncModelAverager(CommunicatorPtr comm, TensorView params,
                                       std::mutex& params_lock, AsyncAverageOptions options)
    : comm_(std::move(comm)),
      params_(std::move(params)),
      params_lock_(params_lock),
      options_(options) {
  RELAXCC_ENFORCE(comm_ != nullptr, InvalidArgument, "AsyncModelAverager: null communicator");
  const int rank = comm_->rank();
  relaxed::require_host("AsyncModelAverager", rank, params_, ExecContext::host());
  params_.check_valid("AsyncModelAverager parameters");
  RELAXCC_ENFORCE(is_floating(params_.dtype), InvalidArgument, "AsyncModelAverager on rank ", rank,
                  ": averages floating host tensors, got ", dtype_name(params_.dtype), " on ",
                  params_.device);
  RELAXCC_ENFORCE(options_.interval_steps >= 1 && options_.warmup_steps >= 0 &&
                      options_.max_staleness_steps >= 1,
                  InvalidArgument, "AsyncModelAverager on rank ", rank,
                  ": expected interval_steps >= 1 (got ", options_.interval_steps,
                  "), warmup_steps >= 0 (got ", options_.warmup_steps,
                  "), max_staleness_steps >= 1 (got ", options_.max_staleness_steps, ")");
  const GossipMode mode = options_.mode;
  RELAXCC_ENFORCE(mode == GossipMode::all || mode == GossipMode::ring ||
                      mode == GossipMode::shift_one || mode == GossipMode::exponential,
                  InvalidArgument, "AsyncModelAverager on rank ", rank, ": mode ",
                  static_cast<int>(mode), ", expected all, ring, shift_one or exponential");
  RELAXCC_ENFORCE(options_.round_deadline.count() >= 0, InvalidArgument,
                  "AsyncModelAverager on rank ", rank, ": round_deadline ",
                  options_.round_deadline.count(), " us, expected >= 0 (0: none)");
  RELAXCC_ENFORCE(mode != GossipMode::all ||
                      (options_.round_deadline.count() == 0 && options_.adaptive == nullptr),
                  InvalidArgument, "AsyncModelAverager on rank ", rank,
                  ": mode all is an allreduce and takes no deadline (got ",
                  options_.round_deadline.count(), " us",
                  options_.adaptive ? " and an adaptive deadline" : "", ")");
  RELAXCC_ENFORCE(
      mode == GossipMode::all || (options_.tag >= 0 && options_.tag < comm_->max_p2p_tag()),
      InvalidArgument, "AsyncModelAverager on rank ", rank, ": gossip ", gossip_mode_name(mode),
      " uses tags tag and tag + 1: expected tag in [0, ", comm_->max_p2p_tag() - 1, "], got ",
      options_.tag);
  RELAXCC_ENFORCE(options_.first_round >= 1, InvalidArgument, "AsyncModelAverager on rank ", rank,
                  ": first_round ", options_.first_round, ", expected >= 1");
  round_ = options_.first_round - 1;
  if (mode != GossipMode::all && options_.round_deadline.count() == 0 &&
      options_.adaptive == nullptr && options_.learn_deadline)
    own_adaptive_ = std::make_unique<AdaptiveDeadline>();
}

AdaptiveDeadline* AsyncModelAverager::learned_deadline() const {
  return options_.adaptive ? options_.adaptive : own_adaptive_.get();
}

AsyncModelAverager::~AsyncModelAverager() {
  try {
    stop();
  } catch (const std::exception& e) {
    RELAXCC_LOG(warn, "AsyncModelAverager: stop failed: ", e.what());
  }
}

void AsyncModelAverager::start_round() {
  const size_t bytes = params_.nbytes();
  auto snapshot = std::make_shared<std::vector<unsigned char>>(std::max<size_t>(bytes, 1));
  auto averaged = std::make_shared<std::vector<unsigned char>>(std::max<size_t>(bytes, 1));
  {
    std::lock_guard<std::mutex> lock(params_lock_);
    if (bytes > 0) std::memcpy(snapshot->data(), params_.data, bytes);
  }
  if (bytes > 0) std::memcpy(averaged->data(), snapshot->data(), bytes);
  const TensorView work(averaged->data(), params_.numel, params_.dtype, Device::host(), averaged);
  GossipOptions g;
  g.mode = options_.mode;
  g.round = round_;
  g.priority = options_.priority;
  g.label = "async model average";
  g.tag = options_.tag;
  g.adaptive = learned_deadline();
  g.stats = options_.stats;
  if (options_.round_deadline.count() > 0) g.deadline = Clock::now() + options_.round_deadline;
  in_flight_ = gossip(*comm_, work, ExecContext::host(), g);  // mode all: an allreduce
  round_state_ = std::make_unique<Round>(Round{snapshot, averaged, steps_});
  {
    std::lock_guard<std::mutex> lock(counts_mutex_);
    ++counts_.started;
  }
  in_flight_step_ = steps_;
  in_flight_since_ = Clock::now();
}

void AsyncModelAverager::apply_round() {
  const std::unique_ptr<Round> r = std::move(round_state_);
  {
    std::lock_guard<std::mutex> lock(params_lock_);
    // x += avg - snapshot: keeps what the optimizer did meanwhile.
    relaxed::visit_averaged(params_.dtype, [&](auto tag) {
      using T = decltype(tag);
      T* x = params_.as<T>();
      const T* avg = reinterpret_cast<const T*>(r->averaged->data());
      const T* snap = reinterpret_cast<const T*>(r->snapshot->data());
      for (int64_t i = 0; i < params_.numel; ++i)
        relaxed::store(x, i, relaxed::load(x, i) + relaxed::load(avg, i) - relaxed::load(snap, i));
    });
  }
  std::lock_guard<std::mutex> lock(counts_mutex_);
  ++counts_.applied;
  counts_.max_staleness_seen = std::max(counts_.max_staleness_seen, steps_ - r->started_at);
}

void AsyncModelAverager::step() {
  RELAXCC_ENFORCE(!stopped_, InvalidArgument, "AsyncModelAverager: step() after stop()");
  ++steps_;
  const bool due = steps_ > options_.warmup_steps &&
                   (steps_ - options_.warmup_steps) % options_.interval_steps == 0;
  if (due) ++round_;
  const bool in_flight = in_flight_ && !in_flight_->is_completed();
  const bool stale = in_flight && (steps_ - in_flight_step_ >= options_.max_staleness_steps ||
                                   Clock::now() - in_flight_since_ >= options_.max_staleness);
  // Every rank starts every due round: a due one waits for the round in
  // flight, which a deadline bounds (a straggler is not waited for).
  if (in_flight && (stale || due)) {
    {
      std::lock_guard<std::mutex> lock(counts_mutex_);
      ++counts_.waits;
    }
    in_flight_->wait(options_.stop_timeout);
  }
  if (in_flight_ && in_flight_->is_completed()) {
    WorkPtr done = std::exchange(in_flight_, nullptr);
    done->wait(std::chrono::milliseconds(0));  // rethrows a failed round
    apply_round();
  }
  if (due && !in_flight_) start_round();
}

bool AsyncModelAverager::stop() {
  if (!stopped_) {
    stopped_ = true;
    if (in_flight_) {
      const WorkPtr last = std::exchange(in_flight_, nullptr);
      try {
        if (last->wait_for(options_.stop_timeout)) apply_round();  // no poisoning: a bound
      } catch (const Error& e) {
        RELAXCC_LOG(warn, "AsyncModelAverager: the last average failed: ", e.what());
      }
    }
  }
  std::lock_guard<std::mutex> lock(counts_mutex_);
  return counts_.applied == counts_.started;
}

AsyncAverageCounts AsyncModelAverager::counts() const {
  std::lock_guard<std::mutex> lock(counts_mutex_);
  return counts_;
}

}  // namespace relaxcc
