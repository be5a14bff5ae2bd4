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

// A parameter tensor in a bucket: its registration index, flat offset, and
// offset in the bucket's buffer.
struct Diloco::Slice {
  int tensor = 0;
  int64_t flat = 0, at = 0, numel = 0;
};

// One bucket's exchange, with the layout it started with.
struct Diloco::Exchange {
  std::vector<Slice> slices;
  std::string key;  // the bucket's server-side state key
  std::shared_ptr<std::vector<float>> buffer;
  std::shared_ptr<std::vector<std::byte>> gathered;  // chunk_topk: every rank's payload
  size_t payload_bytes = 0;
  std::unique_ptr<CompressedAllreduceState> dense;
  std::unique_ptr<kernels::ErrorFeedback> worker, server;
  WorkPtr work;
};

// One fragment: its buckets of the current plan, and its exchange.
struct Diloco::Fragment {
  int first = 0, last = 0;          // buckets_[first, last)
  int64_t offset = 0;               // o_p: syncs at inner steps k = o_p (mod H)
  std::vector<Exchange> exchanges;  // started and not yet finished
  std::vector<Slice> synced;        // the elements of the pending exchange
  bool pending = false;             // an exchange started and not applied
  int64_t apply_at = -1;            // the inner step after which it is applied
};

DilocoOptions diloco_paper_options(int inner_steps) {
  DilocoOptions o;
  o.inner_steps = inner_steps;
  o.outer_lr = 0.7f;
  o.outer_momentum = 0.9f;
  o.nesterov = true;
  return o;
}

DilocoOptions sparseloco_options(int inner_steps) {
  DilocoOptions o;
  o.inner_steps = inner_steps;
  o.outer_lr = 1.0f;
  o.outer_momentum = 0.0f;
  o.nesterov = false;
  kernels::ChunkTopkConfig c;
  c.chunk = 64;
  c.ratio = 0.03;  // 2 of 64
  c.bits = 2;
  c.group = 128;
  o.chunk_topk = c;
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
  RELAXCC_ENFORCE(!(o.codec && o.chunk_topk), InvalidArgument,
                  "diloco: set codec or chunk_topk, not both");
  if (o.codec) {
    o.codec->validate();
    RELAXCC_ENFORCE(o.codec->kind != kernels::CompressorKind::cocktail, InvalidArgument,
                    "diloco: codec must be a dense kind, topk or randomk, got cocktail");
    RELAXCC_ENFORCE(!(o.hierarchical && sparse(*o.codec)), InvalidArgument,
                    "diloco: the hierarchical allreduce takes dense codecs, got ",
                    kernels::compressor_name(o.codec->kind));
  }
  if (o.chunk_topk) {
    o.chunk_topk->validate();
    RELAXCC_ENFORCE(!o.hierarchical, InvalidArgument,
                    "diloco: the hierarchical allreduce takes dense codecs, got chunk_topk");
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
  c.depends_on_bucket_boundaries = options_.fragments > 1 || compressed();
  return c;
}

void Diloco::init(const AlgorithmContext& ctx) {
  ctx_ = ctx;
  FlatParameters flat;
  flat.bind(ctx, "diloco");
  flat_of_.assign(ctx.tensors->size(), -1);
  for (size_t i = 0; i < flat.tensors.size(); ++i)
    flat_of_[static_cast<size_t>(flat.tensors[i])] = flat.offsets[i];
  RELAXCC_ENFORCE(numel_ == 0 || numel_ == flat.numel, InvalidArgument, "diloco: rank ",
                  ctx.comm->rank(), ": the parameters changed from ", numel_, " to ", flat.numel,
                  " elements");
  numel_ = flat.numel;
  // The plan's buckets, as slices of their gradients' partner parameters.
  buckets_.clear();
  bucket_numel_.clear();
  for (const Bucket& b : ctx.plan->buckets()) {
    std::vector<Slice> slices;
    for (const BucketEntry& e : b.entries) {
      const TensorSpec& g = (*ctx.tensors)[static_cast<size_t>(e.tensor)];
      const int p = g.partner;
      RELAXCC_ENFORCE(p >= 0 && p < static_cast<int>(ctx.tensors->size()) &&
                          flat_of_[static_cast<size_t>(p)] >= 0 &&
                          (*ctx.tensors)[static_cast<size_t>(p)].view.numel == e.numel,
                      InvalidArgument, "diloco: rank ", ctx.comm->rank(), ": gradient '", g.name,
                      "' needs a partner parameter (TensorSpec::partner) of ", e.numel,
                      " f32 elements on the host, got partner ", p);
      slices.push_back({p, flat_of_[static_cast<size_t>(p)], e.offset, e.numel});
    }
    if (slices.empty()) continue;
    buckets_.push_back(std::move(slices));
    bucket_numel_.push_back(b.numel);
  }
  const int nf = options_.fragments;
  const int nb = static_cast<int>(buckets_.size());
  RELAXCC_ENFORCE(nf <= nb, InvalidArgument, "diloco: rank ", ctx.comm->rank(), ": ", nf,
                  " fragments of whole buckets need at least ", nf,
                  " buckets of parameters, the plan has ", nb,
                  " (lower ReducerOptions.plan.cap_bytes, or use fewer fragments)");
  if (compressed() && options_.hierarchical && !have_hierarchy_) {
    hierarchy_ = build_hierarchy(*ctx.comm, ctx.tunables);
    have_hierarchy_ = true;
  }
  if (global_.empty()) {
    start_.assign(static_cast<size_t>(numel_), 0.0f);
    at_sync_ = start_;
    averaged_ = start_;
    if (compressed() && options_.error_feedback) residual_ = start_;
  }
  // Fragments of whole buckets, balanced by elements: fragment p ends at the
  // first bucket boundary at or past (p + 1) / F of the model, leaving a
  // bucket for each later fragment. A pending exchange keeps its own slices.
  int64_t total = 0;
  for (const auto& s : buckets_)
    for (const Slice& x : s) total += x.numel;
  if (fragments_.empty()) {
    for (int p = 0; p < nf; ++p) {
      auto f = std::make_unique<Fragment>();
      f->offset = static_cast<int64_t>(p) * options_.inner_steps / nf;
      fragments_.push_back(std::move(f));
    }
  }
  int b = 0;
  int64_t done = 0;
  for (int p = 0; p < nf; ++p) {
    Fragment& f = *fragments_[static_cast<size_t>(p)];
    f.first = b;
    const int64_t target = total * (p + 1) / nf;
    const int max_last = nb - (nf - 1 - p);
    do {
      for (const Slice& x : buckets_[static_cast<size_t>(b)]) done += x.numel;
      ++b;
    } while (b < max_last && done < target);
    if (p == nf - 1) b = nb;
    f.last = b;
  }
}

std::pair<int, int> Diloco::fragment(int p) const {
  const Fragment& f = *fragments_.at(static_cast<size_t>(p));
  return {f.first, f.last};
}

void Diloco::before_optimizer_step(const StepInfo&) {
  // theta_g and theta_start: the model before the first local step.
  if (!global_.empty()) return;
  global_.assign(static_cast<size_t>(numel_), 0.0f);
  for (size_t i = 0; i < flat_of_.size(); ++i) {
    if (flat_of_[i] < 0) continue;
    const TensorView& v = (*ctx_.tensors)[i].view;
    std::memcpy(global_.data() + flat_of_[i], v.data, v.nbytes());
  }
  start_ = global_;
}

WorkPtr Diloco::average(Exchange& e, int bucket, int64_t k) {
  std::vector<float>& buf = *e.buffer;
  const auto n = static_cast<int64_t>(buf.size());
  const TensorView x = TensorView::host(buf.data(), n, e.buffer);
  const std::string label = "diloco bucket " + std::to_string(bucket) + " (" + e.key +
                            ") inner step " + std::to_string(k);
  if (options_.chunk_topk) {
    // Worker-side error feedback: e = delta + residual, payload = C(e),
    // residual = e - decode(payload); then every rank's payload, gathered.
    const kernels::ChunkTopkConfig& c = *options_.chunk_topk;
    e.payload_bytes = kernels::chunk_topk_encoded_size(n, c);
    auto payload = std::make_shared<std::vector<std::byte>>(e.payload_bytes);
    kernels::chunk_topk_encode(x, *payload, c, ctx_.exec);
    if (!residual_.empty()) {
      std::vector<float> sent(buf.size());
      kernels::chunk_topk_decode(*payload, TensorView::host(sent.data(), n), false, ctx_.exec);
      for (const Slice& s : e.slices)
        for (int64_t j = 0; j < s.numel; ++j)
          residual_[static_cast<size_t>(s.flat + j)] = buf[s.at + j] - sent[s.at + j];
    }
    const int ranks = ctx_.comm->size();
    e.gathered = std::make_shared<std::vector<std::byte>>(e.payload_bytes * ranks);
    AllgatherOptions o;
    o.label = label;
    return ctx_.comm->allgather(
        TensorView(payload->data(), static_cast<int64_t>(e.payload_bytes), DType::u8,
                   Device::host(), payload),
        TensorView(e.gathered->data(), static_cast<int64_t>(e.gathered->size()), DType::u8,
                   Device::host(), e.gathered),
        ctx_.exec, o);
  }
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
    o.feedback = e.worker.get();
    o.server_feedback = e.server.get();
    o.label = label;
    return sparse_allreduce(*ctx_.comm, x, ctx_.exec, o);
  }
  CompressedAllreduceOptions o;
  o.codec = options_.codec;
  o.op = ReduceOp::avg;
  o.state = e.dense.get();
  o.label = label;
  if (options_.hierarchical)
    return hierarchical_compressed_allreduce(*ctx_.comm, hierarchy_, x, ctx_.exec, o);
  return compressed_allreduce(*ctx_.comm, x, ctx_.exec, o);
}

void Diloco::start_exchange(Fragment& f, int64_t k) {
  const bool feedback = !residual_.empty();
  f.synced.clear();
  for (int b = f.first; b < f.last; ++b) {
    Exchange e;
    e.slices = buckets_[static_cast<size_t>(b)];
    e.key = "bucket" + std::to_string(e.slices.front().flat) + "x" +
            std::to_string(bucket_numel_[static_cast<size_t>(b)]);
    e.buffer = std::make_shared<std::vector<float>>(
        static_cast<size_t>(bucket_numel_[static_cast<size_t>(b)]), 0.0f);
    const auto numel = static_cast<int64_t>(e.buffer->size());
    float* buf = e.buffer->data();
    // Bucket b's pseudo-gradient, computed while bucket b - 1 travels.
    for (const Slice& s : e.slices) {
      const float* x = (*ctx_.tensors)[static_cast<size_t>(s.tensor)].view.as<float>();
      float* at = at_sync_.data() + s.flat;
      const float* st = start_.data() + s.flat;
      std::memcpy(at, x, static_cast<size_t>(s.numel) * sizeof(float));
      for (int64_t j = 0; j < s.numel; ++j) buf[s.at + j] = st[j] - x[j];
      if (feedback && options_.feedback_decay != 1.0f)
        for (int64_t j = 0; j < s.numel; ++j)
          residual_[static_cast<size_t>(s.flat + j)] *= options_.feedback_decay;
    }
    if (feedback && options_.chunk_topk) {
      for (const Slice& s : e.slices)
        for (int64_t j = 0; j < s.numel; ++j)
          buf[s.at + j] += residual_[static_cast<size_t>(s.flat + j)];
    } else if (feedback) {
      // The relaxed primitives' own error feedback, filled from the flat
      // residual and the bucket's server-side state.
      std::vector<float>* worker = nullptr;
      std::vector<float>* server = nullptr;
      if (sparse(*options_.codec)) {
        e.worker = std::make_unique<kernels::ErrorFeedback>(numel);
        worker = &e.worker->residual();
        if (options_.codec->kind == kernels::CompressorKind::topk) {
          e.server = std::make_unique<kernels::ErrorFeedback>(
              sparse_allreduce_owned(numel, ctx_.comm->rank(), ctx_.comm->size()));
          server = &e.server->residual();
        }
      } else {
        const Communicator* on = options_.hierarchical ? hierarchy_.inter.get() : ctx_.comm.get();
        if (on != nullptr) {
          e.dense = std::make_unique<CompressedAllreduceState>(numel, on->rank(), on->size());
          worker = &e.dense->worker();
          server = &e.dense->server();
        }
      }
      if (worker != nullptr)
        for (const Slice& s : e.slices)
          std::memcpy(worker->data() + s.at, residual_.data() + s.flat,
                      static_cast<size_t>(s.numel) * sizeof(float));
      const auto saved = server_.find(e.key);
      if (server != nullptr && saved != server_.end() && saved->second.size() == server->size())
        *server = saved->second;
    }
    e.work = average(e, b, k);
    f.synced.insert(f.synced.end(), e.slices.begin(), e.slices.end());
    f.exchanges.push_back(std::move(e));
  }
  f.pending = true;
  f.apply_at = k + delay();
}

void Diloco::finish(Fragment& f, std::chrono::milliseconds timeout) {
  for (Exchange& e : f.exchanges) {
    if (e.work) {
      WorkPtr w = std::move(e.work);
      w->wait(timeout);
    }
    std::vector<float>& buf = *e.buffer;
    if (e.gathered) {
      // Every rank's payload decoded in rank order: the same sum everywhere.
      const int ranks = ctx_.comm->size();
      const auto n = static_cast<int64_t>(buf.size());
      std::fill(buf.begin(), buf.end(), 0.0f);
      for (int r = 0; r < ranks; ++r)
        kernels::chunk_topk_decode(
            std::span<const std::byte>(e.gathered->data() + e.payload_bytes * r, e.payload_bytes),
            TensorView::host(buf.data(), n), true, ctx_.exec);
      for (float& v : buf) v /= static_cast<float>(ranks);
    }
    for (const Slice& s : e.slices)
      std::memcpy(averaged_.data() + s.flat, buf.data() + s.at,
                  static_cast<size_t>(s.numel) * sizeof(float));
    const std::vector<float>* worker = e.worker  ? &e.worker->residual()
                                       : e.dense ? &e.dense->worker()
                                                 : nullptr;
    const std::vector<float>* server = e.server  ? &e.server->residual()
                                       : e.dense ? &e.dense->server()
                                                 : nullptr;
    if (worker != nullptr)
      for (const Slice& s : e.slices)
        std::memcpy(residual_.data() + s.flat, worker->data() + s.at,
                    static_cast<size_t>(s.numel) * sizeof(float));
    if (server != nullptr) server_[e.key] = *server;
  }
  f.exchanges.clear();
}

void Diloco::apply(Fragment& f) {
  finish(f, std::chrono::milliseconds(-1));
  for (const Slice& s : f.synced) {
    float* g = global_.data() + s.flat;
    outer_->update(TensorView::host(g, s.numel),
                   TensorView::host(averaged_.data() + s.flat, s.numel), s.flat);
    // theta = theta_g - (theta_at_sync - theta): the progress since the sync
    // stays on top of the new global parameters.
    float* x = (*ctx_.tensors)[static_cast<size_t>(s.tensor)].view.as<float>();
    const float* at = at_sync_.data() + s.flat;
    for (int64_t j = 0; j < s.numel; ++j) x[j] = g[j] - (at[j] - x[j]);
    std::memcpy(start_.data() + s.flat, g, static_cast<size_t>(s.numel) * sizeof(float));
  }
  f.pending = false;
  f.apply_at = -1;
  ++outer_steps_;
}

WorkPtr Diloco::after_optimizer_step(const StepInfo& step) {
  const int64_t k = step.step + 1;  // inner steps taken
  const int64_t h = options_.inner_steps;
  RELAXCC_ENFORCE(!global_.empty(), InvalidArgument, "diloco: no global model at step ", step.step);
  for (auto& f : fragments_) {
    if (f->pending && f->apply_at == k) apply(*f);
    if (k % h != f->offset % h) continue;
    RELAXCC_ENFORCE(!f->pending, InternalError, "diloco: fragment of buckets [", f->first, ", ",
                    f->last, ") syncs at inner step ", k, " with its previous exchange unapplied");
    start_exchange(*f, k);
    if (delay() == 0) apply(*f);
  }
  return nullptr;
}

void Diloco::drain(std::chrono::milliseconds timeout) {
  for (auto& f : fragments_) finish(*f, timeout);
}

void Diloco::average_model(std::chrono::milliseconds timeout) {
  average_parameters(ctx_, "diloco: exact model average", timeout);
}

StateDict Diloco::state_dict() const {
  StateDict sd;
  sd.put_int("diloco/outer_steps", outer_steps_);
  sd.put_floats("diloco/global", global_);
  sd.put_floats("diloco/start", start_);
  sd.put_floats("diloco/at_sync", at_sync_);
  sd.put_floats("diloco/averaged", averaged_);
  if (!residual_.empty()) sd.put_floats("diloco/feedback/worker", residual_);
  sd.put_int("diloco/feedback/servers", static_cast<int64_t>(server_.size()));
  int i = 0;
  for (const auto& [key, values] : server_) {
    const std::string k = "diloco/feedback/server" + std::to_string(i++);
    sd.put_floats(k, values);
    sd.put_int(k + "/first", std::stoll(key.substr(6, key.find('x') - 6)));
    sd.put_int(k + "/numel", std::stoll(key.substr(key.find('x') + 1)));
  }
  for (size_t p = 0; p < fragments_.size(); ++p) {
    const Fragment& f = *fragments_[p];
    RELAXCC_ENFORCE(f.exchanges.empty(), InvalidArgument,
                    "diloco: state_dict() with an exchange in flight (call drain() first)");
    const std::string key = "diloco/fragment" + std::to_string(p) + "/";
    sd.put_int(key + "apply_at", f.pending ? f.apply_at : -1);
    if (!f.pending) continue;
    sd.put_int(key + "slices", static_cast<int64_t>(f.synced.size()));
    for (size_t s = 0; s < f.synced.size(); ++s) {
      const std::string sk = key + "slice" + std::to_string(s) + "/";
      sd.put_int(sk + "tensor", f.synced[s].tensor);
      sd.put_int(sk + "flat", f.synced[s].flat);
      sd.put_int(sk + "numel", f.synced[s].numel);
    }
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
  for (const auto& f : fragments_)
    RELAXCC_ENFORCE(f->exchanges.empty(), InvalidArgument,
                    "diloco: load_state_dict() with an exchange in flight (drain first)");
  outer_steps_ = state.get_int("diloco/outer_steps");
  sized("diloco/global", global_, numel_);
  sized("diloco/start", start_, numel_);
  sized("diloco/at_sync", at_sync_, numel_);
  sized("diloco/averaged", averaged_, numel_);
  if (!residual_.empty()) sized("diloco/feedback/worker", residual_, numel_);
  server_.clear();
  const int64_t servers = state.get_int("diloco/feedback/servers");
  for (int64_t i = 0; i < servers; ++i) {
    const std::string k = "diloco/feedback/server" + std::to_string(i);
    server_["bucket" + std::to_string(state.get_int(k + "/first")) + "x" +
            std::to_string(state.get_int(k + "/numel"))] = state.get_floats(k);
  }
  for (size_t p = 0; p < fragments_.size(); ++p) {
    Fragment& f = *fragments_[p];
    const std::string key = "diloco/fragment" + std::to_string(p) + "/";
    f.apply_at = state.get_int(key + "apply_at");
    f.pending = f.apply_at >= 0;
    f.synced.clear();
    if (!f.pending) continue;
    const int64_t slices = state.get_int(key + "slices");
    for (int64_t s = 0; s < slices; ++s) {
      const std::string sk = key + "slice" + std::to_string(s) + "/";
      Slice x;
      x.tensor = static_cast<int>(state.get_int(sk + "tensor"));
      x.flat = state.get_int(sk + "flat");
      x.numel = state.get_int(sk + "numel");
      RELAXCC_ENFORCE(x.tensor >= 0 && x.tensor < static_cast<int>(flat_of_.size()) &&
                          flat_of_[static_cast<size_t>(x.tensor)] == x.flat &&
                          (*ctx_.tensors)[static_cast<size_t>(x.tensor)].view.numel == x.numel,
                      InvalidArgument, "diloco: checkpoint entry '", sk,
                      "' names a parameter this model does not have at that offset");
      f.synced.push_back(x);
    }
  }
  StateDict outer;
  const std::string prefix = "diloco/outer/";
  for (const auto& [name, bytes] : state.entries)
    if (name.rfind(prefix, 0) == 0) outer.entries[name.substr(prefix.size())] = bytes;
  outer_->load_state_dict(outer);
}

}  // namespace relaxcc::algorithms
