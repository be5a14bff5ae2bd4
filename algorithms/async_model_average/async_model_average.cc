#include "relaxcc/algorithms/async_model_average.h"

#include <algorithm>

#include "relaxcc/errors.h"

namespace relaxcc::algorithms {

AsyncModelAverage::AsyncModelAverage(AsyncModelAverageOptions options)
    : options_(options), deadline_(options_.deadline, "async_model_average") {
  RELAXCC_ENFORCE(options_.interval_steps >= 1 && options_.warmup_steps >= 0 &&
                      options_.max_staleness_steps >= 1,
                  InvalidArgument,
                  "async_model_average: interval_steps >= 1, warmup_steps >= 0 and "
                  "max_staleness_steps >= 1, got ",
                  options_.interval_steps, ", ", options_.warmup_steps, " and ",
                  options_.max_staleness_steps);
  RELAXCC_ENFORCE(!(deadline_.enabled() && options_.mode == GossipMode::all), InvalidArgument,
                  "async_model_average: mode all is an allreduce and takes no deadline (choose "
                  "a gossip mode, or deadline = {})");
}

// The averagers stop as they are destroyed, before the buffers and the lock
// they use; the parameters are not touched any more.
AsyncModelAverage::~AsyncModelAverage() {
  averagers_.clear();
}

AlgorithmCapabilities AsyncModelAverage::capabilities() const {
  AlgorithmCapabilities c;
  c.communicates_gradients = options_.warmup_steps > 0;
  return c;
}

void AsyncModelAverage::init(const AlgorithmContext& ctx) {
  // A new plan: the averagers of the old buckets stop (applying what came).
  stop_averagers();
  ctx_ = ctx;
  weights_.rebind(ctx, "async_model_average");
  // Bucket b's averager uses tags tag + 2 b and tag + 2 b + 1.
  const int64_t last_tag = int64_t{options_.tag} + 2 * int64_t{weights_.buckets()} - 1;
  RELAXCC_ENFORCE(options_.mode == GossipMode::all || weights_.buckets() == 0 ||
                      (options_.tag >= 0 && last_tag <= ctx_.comm->max_p2p_tag()),
                  InvalidArgument, "async_model_average on rank ", ctx_.comm->rank(), ": ",
                  weights_.buckets(), " buckets of gossip ", gossip_mode_name(options_.mode),
                  " use tags [", options_.tag, ", ", last_tag, "]: expected them within [0, ",
                  ctx_.comm->max_p2p_tag(), "]");
}

WorkPtr AsyncModelAverage::on_bucket_ready(const StepInfo& step, int bucket,
                                           const TensorView& data) {
  if (step.step >= options_.warmup_steps) return nullptr;  // local step
  AllreduceOptions o;
  o.op = ReduceOp::avg;
  o.label = "async_model_average warmup bucket " + std::to_string(bucket);
  return ctx_.comm->allreduce(data, ctx_.exec, o);
}

WorkPtr AsyncModelAverage::after_optimizer_step(const StepInfo& step) {
  if (step.step < options_.warmup_steps) return nullptr;
  if (averagers_.empty()) {
    for (int b = 0; b < weights_.buckets(); ++b) {
      AsyncAverageOptions o;
      o.interval_steps = options_.interval_steps;
      o.max_staleness_steps = options_.max_staleness_steps;
      o.mode = options_.mode;
      o.round_deadline =
          options_.deadline.adaptive ? std::chrono::microseconds(0) : options_.deadline.fixed;
      o.adaptive = deadline_.adaptive();
      o.learn_deadline = false;  // the module's own deadline, if any
      o.stop_timeout = options_.stop_timeout;
      // A fixed tag per bucket index; rounds go on from the averagers
      // stopped before (every bucket's alike), so that a late message of an
      // earlier plan's round on this tag is dropped by its round.
      o.tag = options_.tag + 2 * b;
      o.first_round = next_round_;
      averagers_.push_back(
          std::make_unique<AsyncModelAverager>(ctx_.comm, weights_.view(b), lock_, o));
    }
  }
  // The averager snapshots (and applies to) the bucket's buffer: the
  // parameters go in before and come back after.
  for (int b = 0; b < weights_.buckets(); ++b) {
    weights_.gather(b);
    averagers_[static_cast<size_t>(b)]->step();
    weights_.scatter(b);
  }
  return nullptr;
}

void AsyncModelAverage::stop_averagers() {
  if (averagers_.empty()) return;
  for (int b = 0; b < static_cast<int>(averagers_.size()); ++b) {
    auto& a = averagers_[static_cast<size_t>(b)];
    weights_.gather(b);
    a->stop();
    weights_.scatter(b);
    next_round_ = std::max(next_round_, a->last_round() + 1);
    const AsyncAverageCounts c = a->counts();
    finished_.started += c.started;
    finished_.applied += c.applied;
    finished_.waits += c.waits;
    finished_.max_staleness_seen = std::max(finished_.max_staleness_seen, c.max_staleness_seen);
  }
  averagers_.clear();
}

void AsyncModelAverage::shutdown(std::chrono::milliseconds) {
  stop_averagers();
}

void AsyncModelAverage::average_model(std::chrono::milliseconds timeout) {
  stop_averagers();
  average_parameters(ctx_, "async_model_average: exact model average", timeout);
}

AsyncAverageCounts AsyncModelAverage::counts() const {
  AsyncAverageCounts c = finished_;
  for (const auto& a : averagers_) {
    const AsyncAverageCounts n = a->counts();
    c.started += n.started;
    c.applied += n.applied;
    c.waits += n.waits;
    c.max_staleness_seen = std::max(c.max_staleness_seen, n.max_staleness_seen);
  }
  return c;
}

StateDict AsyncModelAverage::state_dict() const {
  const AsyncAverageCounts c = counts();
  StateDict sd;
  sd.put_int("async_model_average/started", c.started);
  sd.put_int("async_model_average/applied", c.applied);
  return sd;
}

void AsyncModelAverage::load_state_dict(const StateDict& state) {
  finished_ = AsyncAverageCounts{};
  finished_.started = state.get_int("async_model_average/started");
  finished_.applied = state.get_int("async_model_average/applied");
}

}  // namespace relaxcc::algorithms
