#include "relaxcc/algorithms/diloco.h"

#include <cstring>

#include "relaxcc/errors.h"
#include "relaxcc/kernels/error_feedback.h"
#include "relaxcc/relaxed/compressed_allreduce.h"
#include "relaxcc/relaxed/sparse_allreduce.h"

namespace relaxcc::algorithms {

namespace {

bool sparse(const kernels::CompressorConfig& c) {
  return c.kind == kernels::CompressorKind::topk || c.kind == kernels::CompressorKind::randomk;
}

}  // namespace

// One fragment's outer state and its exchange.
struct Diloco::Fragment {
  int first = 0, last = 0;  // its tensors: params_[first, last)
  int64_t begin = 0, numel = 0;
  int64_t offset = 0;                             // o_p: syncs at inner steps k = o_p (mod H)
  std::vector<float> global, start;               // theta_g, theta_start
  std::vector<float> at_sync;                     // theta at the sync of the pending exchange
  std::shared_ptr<std::vector<float>> exchange =  // delta, averaged in place
      std::make_shared<std::vector<float>>();
  WorkPtr in_flight;
  bool pending = false;                             // an exchange started and not applied
  int64_t apply_at = -1;                            // the inner step after which it is applied
  std::unique_ptr<CompressedAllreduceState> dense;  // dense codecs
  std::unique_ptr<kernels::ErrorFeedback> worker, server;  // sparse codecs
};

DilocoOptions sparseloco_options(int inner_steps) {
  DilocoOptions o;
  o.inner_steps = inner_steps;
  o.outer_lr = 1.0f;
  o.outer_momentum = 0.0f;
  o.nesterov = false;
  kernels::CompressorConfig c;
  c.kind = kernels::CompressorKind::topk;
  c.ratio = 0.03;
  c.approximate = false;
  o.codec = c;
  o.error_feedback = true;
  o.feedback_decay = 0.95f;
  return o;
}

Diloco::Diloco(DilocoOptions options) : options_(std::move(options)) {
  const DilocoOptions& o = options_;
  RELAXCC_ENFORCE(o.inner_steps >= 1, InvalidArgument, "diloco: inner_steps (H) must be >= 1, got ",
                  o.inner_steps);
  RELAXCC_ENFORCE(o.outer_lr > 0, InvalidArgument, "diloco: outer_lr must be > 0, got ",
                  o.outer_lr);
  RELAXCC_ENFORCE(o.outer_momentum >= 0 && o.outer_momentum < 1, InvalidArgument,
                  "diloco: outer_momentum must be in [0, 1), got ", o.outer_momentum);
  RELAXCC_ENFORCE(o.fragments >= 1 && o.fragments <= o.inner_steps, InvalidArgument,
                  "diloco: fragments must be in [1, inner_steps = ", o.inner_steps,
                  "] (each fragment syncs at its own inner step), got ", o.fragments);
  RELAXCC_ENFORCE(o.overlap_steps >= 0 && o.overlap_steps <= o.inner_steps, InvalidArgument,
                  "diloco: overlap_steps must be in [0, inner_steps = ", o.inner_steps, "], got ",
                  o.overlap_steps);
  RELAXCC_ENFORCE(o.feedback_decay > 0 && o.feedback_decay <= 1, InvalidArgument,
                  "diloco: feedback_decay must be in (0, 1], got ", o.feedback_decay);
  if (o.codec) {
    o.codec->validate();
    RELAXCC_ENFORCE(o.codec->kind != kernels::CompressorKind::cocktail, InvalidArgument,
                    "diloco: codec must be a dense kind, topk or randomk, got cocktail");
    RELAXCC_ENFORCE(!(o.hierarchical && sparse(*o.codec)), InvalidArgument,
                    "diloco: the hierarchical allreduce takes dense codecs, got ",
                    kernels::compressor_name(o.codec->kind));
  }
  SgdOptions s;
  s.lr = o.outer_lr;
  s.momentum = o.outer_momentum;
  s.nesterov = o.nesterov && o.outer_momentum > 0;
  outer_ = std::make_unique<Sgd>(s);
}

Diloco::~Diloco() = default;

AlgorithmCapabilities Diloco::capabilities() const {
  AlgorithmCapabilities c;
  c.communicates_gradients = false;
  return c;
}

void Diloco::init(const AlgorithmContext& ctx) {
  ctx_ = ctx;
  FlatParameters flat;
  flat.bind(ctx, "diloco");
  params_ = std::move(flat.tensors);
  param_at_ = std::move(flat.offsets);
  numel_ = flat.numel;
  const int nf = options_.fragments;
  RELAXCC_ENFORCE(nf <= static_cast<int>(params_.size()), InvalidArgument, "diloco: rank ",
                  ctx.comm->rank(), ": ", nf, " fragments of whole tensors need at least ", nf,
                  " parameter tensors, got ", params_.size());
  if (options_.hierarchical && options_.codec && !have_hierarchy_) {
    hierarchy_ = build_hierarchy(*ctx.comm, ctx.tunables);
    have_hierarchy_ = true;
  }
  // Fragments of whole tensors, balanced by elements: fragment p ends at the
  // first tensor boundary at or past (p + 1) / F of the model, leaving a
  // tensor for each later fragment. The plan never changes them.
  if (!fragments_.empty()) return;
  int t = 0;
  for (int p = 0; p < nf; ++p) {
    auto f = std::make_unique<Fragment>();
    f->first = t;
    f->begin = param_at_[static_cast<size_t>(t)];
    const int64_t target = numel_ * (p + 1) / nf;
    const int max_last = static_cast<int>(params_.size()) - (nf - 1 - p);
    t = f->first + 1;  // at least one tensor
    while (t < max_last && param_at_[static_cast<size_t>(t)] < target) ++t;
    if (p == nf - 1) t = static_cast<int>(params_.size());
    f->last = t;
    const int64_t end =
        t < static_cast<int>(params_.size()) ? param_at_[static_cast<size_t>(t)] : numel_;
    f->numel = end - f->begin;
    f->offset = static_cast<int64_t>(p) * options_.inner_steps / nf;
    if (options_.codec && options_.error_feedback) {
      if (sparse(*options_.codec)) {
        f->worker = std::make_unique<kernels::ErrorFeedback>(f->numel);
        if (options_.codec->kind == kernels::CompressorKind::topk)
          f->server = std::make_unique<kernels::ErrorFeedback>(
              sparse_allreduce_owned(f->numel, ctx.comm->rank(), ctx.comm->size()));
      } else {
        const Communicator* on = options_.hierarchical ? hierarchy_.inter.get() : ctx.comm.get();
        if (on != nullptr)
          f->dense = std::make_unique<CompressedAllreduceState>(f->numel, on->rank(), on->size());
      }
    }
    fragments_.push_back(std::move(f));
  }
}

std::pair<int64_t, int64_t> Diloco::fragment(int p) const {
  const Fragment& f = *fragments_.at(static_cast<size_t>(p));
  return {f.begin, f.begin + f.numel};
}

void Diloco::gather(const Fragment& f, std::vector<float>& out) const {
  out.resize(static_cast<size_t>(f.numel));
  for (int i = f.first; i < f.last; ++i) {
    const TensorView& v =
        (*ctx_.tensors)[static_cast<size_t>(params_[static_cast<size_t>(i)])].view;
    std::memcpy(out.data() + (param_at_[static_cast<size_t>(i)] - f.begin), v.data, v.nbytes());
  }
}

void Diloco::before_optimizer_step(const StepInfo&) {
  // theta_g and theta_start: the model before the first local step.
  for (auto& f : fragments_) {
    if (!f->global.empty()) continue;
    gather(*f, f->global);
    f->start = f->global;
  }
}

WorkPtr Diloco::average(Fragment& f, int64_t k) {
  const TensorView x = TensorView::host(f.exchange->data(), f.numel, f.exchange);
  const std::string label =
      "diloco fragment at " + std::to_string(f.begin) + " inner step " + std::to_string(k);
  if (!options_.codec) {
    AllreduceOptions o;
    o.op = ReduceOp::avg;
    o.label = label;
    return ctx_.comm->allreduce(x, ctx_.exec, o);
  }
  if (sparse(*options_.codec)) {
    SparseAllreduceOptions o;
    o.codec = *options_.codec;
    o.codec.step = static_cast<uint64_t>(k);
    o.op = ReduceOp::avg;
    o.feedback = f.worker.get();
    o.server_feedback = f.server.get();
    o.label = label;
    return sparse_allreduce(*ctx_.comm, x, ctx_.exec, o);
  }
  CompressedAllreduceOptions o;
  o.codec = options_.codec;
  o.op = ReduceOp::avg;
  o.state = f.dense.get();
  o.label = label;
  if (options_.hierarchical)
    return hierarchical_compressed_allreduce(*ctx_.comm, hierarchy_, x, ctx_.exec, o);
  return compressed_allreduce(*ctx_.comm, x, ctx_.exec, o);
}

void Diloco::start_exchange(Fragment& f, int64_t k) {
  gather(f, f.at_sync);
  std::vector<float>& delta = *f.exchange;
  delta.resize(static_cast<size_t>(f.numel));
  for (int64_t j = 0; j < f.numel; ++j) delta[j] = f.start[j] - f.at_sync[j];
  if (options_.feedback_decay != 1.0f) {
    std::vector<float>* residual = f.worker  ? &f.worker->residual()
                                   : f.dense ? &f.dense->worker()
                                             : nullptr;
    if (residual != nullptr)
      for (float& e : *residual) e *= options_.feedback_decay;
  }
  f.in_flight = average(f, k);
  f.pending = true;
  f.apply_at = k + delay();
}

void Diloco::apply(Fragment& f) {
  if (f.in_flight) {
    WorkPtr w = std::move(f.in_flight);
    w->wait();
  }
  outer_->update(TensorView::host(f.global.data(), f.numel),
                 TensorView::host(f.exchange->data(), f.numel), f.begin);
  // theta = theta_g - (theta_at_sync - theta): the progress since the sync
  // stays on top of the new global fragment.
  for (int i = f.first; i < f.last; ++i) {
    const TensorView& v =
        (*ctx_.tensors)[static_cast<size_t>(params_[static_cast<size_t>(i)])].view;
    float* x = v.as<float>();
    const int64_t at = param_at_[static_cast<size_t>(i)] - f.begin;
    for (int64_t j = 0; j < v.numel; ++j) x[j] = f.global[at + j] - (f.at_sync[at + j] - x[j]);
  }
  f.start = f.global;
  f.pending = false;
  f.apply_at = -1;
  ++outer_steps_;
}

WorkPtr Diloco::after_optimizer_step(const StepInfo& step) {
  const int64_t k = step.step + 1;  // inner steps taken
  const int64_t h = options_.inner_steps;
  for (auto& f : fragments_) {
    RELAXCC_ENFORCE(!f->global.empty(), InvalidArgument, "diloco: no global model at step ",
                    step.step);
    if (f->pending && f->apply_at == k) apply(*f);
    if (k % h != f->offset % h) continue;
    RELAXCC_ENFORCE(!f->pending, InternalError, "diloco: fragment at ", f->begin,
                    " syncs at inner step ", k, " with its previous exchange unapplied");
    start_exchange(*f, k);
    if (delay() == 0) apply(*f);
  }
  return nullptr;
}

void Diloco::drain(std::chrono::milliseconds timeout) {
  for (auto& f : fragments_) {
    if (!f->in_flight) continue;
    WorkPtr w = std::move(f->in_flight);
    w->wait(timeout);
  }
}

void Diloco::average_model(std::chrono::milliseconds timeout) {
  average_parameters(ctx_, "diloco: exact model average", timeout);
}

StateDict Diloco::state_dict() const {
  StateDict sd;
  sd.put_int("diloco/outer_steps", outer_steps_);
  for (size_t p = 0; p < fragments_.size(); ++p) {
    const Fragment& f = *fragments_[p];
    RELAXCC_ENFORCE(!f.in_flight, InvalidArgument,
                    "diloco: state_dict() with an exchange in flight (call drain() first)");
    const std::string key = "diloco/fragment" + std::to_string(p) + "/";
    sd.put_floats(key + "global", f.global);
    sd.put_floats(key + "start", f.start);
    sd.put_int(key + "apply_at", f.pending ? f.apply_at : -1);
    if (f.pending) {
      sd.put_floats(key + "at_sync", f.at_sync);
      sd.put_floats(key + "exchange", *f.exchange);
    }
    if (f.dense) f.dense->save(sd, key + "feedback/");
    if (f.worker) sd.put_floats(key + "feedback/worker", f.worker->residual());
    if (f.server) sd.put_floats(key + "feedback/server", f.server->residual());
  }
  for (const auto& [name, bytes] : outer_->state_dict().entries)
    sd.entries["diloco/outer/" + name] = bytes;
  return sd;
}

void Diloco::load_state_dict(const StateDict& state) {
  const auto sized = [&state](const std::string& key, std::vector<float>& into, int64_t numel) {
    into = state.get_floats(key);
    RELAXCC_ENFORCE_EQ(static_cast<int64_t>(into.size()), numel, InvalidArgument,
                       "diloco: checkpoint entry '", key, "'");
  };
  outer_steps_ = state.get_int("diloco/outer_steps");
  for (size_t p = 0; p < fragments_.size(); ++p) {
    Fragment& f = *fragments_[p];
    RELAXCC_ENFORCE(!f.in_flight, InvalidArgument,
                    "diloco: load_state_dict() with an exchange in flight (drain first)");
    const std::string key = "diloco/fragment" + std::to_string(p) + "/";
    sized(key + "global", f.global, f.numel);
    sized(key + "start", f.start, f.numel);
    f.apply_at = state.get_int(key + "apply_at");
    f.pending = f.apply_at >= 0;
    if (f.pending) {
      sized(key + "at_sync", f.at_sync, f.numel);
      sized(key + "exchange", *f.exchange, f.numel);
    }
    if (f.dense) f.dense->load(state, key + "feedback/");
    if (f.worker)
      sized(key + "feedback/worker", f.worker->residual(),
            static_cast<int64_t>(f.worker->residual().size()));
    if (f.server)
      sized(key + "feedback/server", f.server->residual(),
            static_cast<int64_t>(f.server->residual().size()));
  }
  StateDict outer;
  const std::string prefix = "diloco/outer/";
  for (const auto& [name, bytes] : state.entries)
    if (name.rfind(prefix, 0) == 0) outer.entries[name.substr(prefix.size())] = bytes;
  outer_->load_state_dict(outer);
}

}  // namespace relaxcc::algorithms
