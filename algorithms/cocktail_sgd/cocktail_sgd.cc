#include "relaxcc/algorithms/cocktail_sgd.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <type_traits>

#include "relaxcc/algorithms/bucket_weights.h"
#include "relaxcc/errors.h"
#include "relaxcc/kernels/error_feedback.h"
#include "relaxcc/kernels/payload_packing.h"

namespace relaxcc::algorithms {

namespace {

template <typename T>
TensorView bytes_view(std::vector<std::byte>& v, const std::shared_ptr<T>& owner) {
  return TensorView(v.data(), static_cast<int64_t>(v.size()), DType::u8, Device::host(), owner);
}

std::span<std::byte> part(std::vector<std::byte>& v, int64_t offset, int64_t bytes) {
  return {v.data() + offset, static_cast<size_t>(bytes)};
}

}  // namespace

// The buffers and stages of one exchange, shared with its stages (which run
// on the communicator's threads) so they outlive the algorithm if need be.
struct CocktailSgd::Exchange {
  kernels::CompressorConfig cfg;
  ExecContext worker_ctx, owner_ctx;  // the worker's and the owner's random streams
  std::vector<int64_t> begin, count;  // the shards
  int rank = 0;
  std::string label;                       // "cocktail_sgd step <t>"
  std::vector<float> delta;                // d_r, flat
  std::vector<float> own;                  // C(d_r), flat
  std::vector<float> average;              // a, flat
  std::vector<float> server;               // the server residual after this exchange
  std::vector<float> scratch, work;        // the owned shard; the owner's codec scratch
  std::vector<std::byte> sent, received;   // alltoallv blocks
  std::vector<std::byte> owned, gathered;  // the owner's payload, every owner's payload
  std::vector<int64_t> bytes;              // payload bytes of each shard
  // With pack_payloads: the packed blocks and their sizes.
  std::vector<std::byte> packed_sent, packed_received, packed_owned, packed_gathered;
  std::vector<int64_t> packed_sizes_out, packed_sizes_in, packed_gathered_sizes;
  int64_t packed_owned_size = 0;
  // The packed exchange's operations in submission order (its callbacks
  // add to them), for a waiter to wait on one after the other.
  std::mutex stages_mutex;
  std::vector<WorkPtr> stages;

  int ranks() const { return static_cast<int>(bytes.size()); }
  WorkPtr add_stage(WorkPtr w) {
    std::lock_guard<std::mutex> lock(stages_mutex);
    stages.push_back(w);
    return w;
  }
  WorkPtr stage_at(size_t i) {
    std::lock_guard<std::mutex> lock(stages_mutex);
    return i < stages.size() ? stages[i] : nullptr;
  }
  // Packed sizes from peers are not trusted: each within [header, bound of
  // its payload's raw bytes]; returns their sum.
  static int64_t checked_sizes(const std::vector<int64_t>& sizes,
                               const std::function<int64_t(int)>& raw, const std::string& what) {
    int64_t sum = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const auto bound = static_cast<int64_t>(kernels::packed_bound(static_cast<size_t>(raw(i))));
      RELAXCC_ENFORCE(
          sizes[i] >= static_cast<int64_t>(sizeof(kernels::PackedHeader)) && sizes[i] <= bound,
          CorruptPayload, what, ": rank ", i, " announced a packed payload of ", sizes[i],
          " bytes, expected ", sizeof(kernels::PackedHeader), " to ", bound);
      sum += sizes[i];
    }
    return sum;
  }
  int64_t offset(int j) const {
    int64_t at = 0;
    for (int i = 0; i < j; ++i) at += bytes[i];
    return at;
  }

  // 1. Encodes every shard of the delta into `sent`, and decodes them into
  // `own`.
  void encode_shards() {
    for (int j = 0; j < ranks(); ++j) {
      const auto shard = TensorView::host(delta.data() + begin[j], count[j]);
      kernels::encode(shard, part(sent, offset(j), bytes[j]), cfg, worker_ctx);
      kernels::decode(part(sent, offset(j), bytes[j]),
                      TensorView::host(own.data() + begin[j], count[j]), worker_ctx);
    }
  }
  // 3. The owner averages the payloads of its shard in `received` and
  // re-encodes the average with its residual into `owned`.
  void reduce_owned() {
    const int64_t mine = bytes[rank];
    const auto acc = TensorView::host(scratch.data(), count[rank]);
    std::fill(scratch.begin(), scratch.end(), 0.0f);
    for (int i = 0; i < ranks(); ++i)
      kernels::decode_accumulate(part(received, i * mine, mine), acc, owner_ctx);
    const float inv = 1.0f / static_cast<float>(ranks());
    for (float& v : scratch) v *= inv;
    work.resize(scratch.size());
    kernels::compress_with_feedback(acc, server, work, std::span<std::byte>(owned), cfg, owner_ctx);
  }
  // 5. Decodes every owner's payload in `gathered` into the average.
  void decode_gathered() {
    for (int j = 0; j < ranks(); ++j)
      kernels::decode(part(gathered, offset(j), bytes[j]),
                      TensorView::host(average.data() + begin[j], count[j]), worker_ctx);
  }

  // Packing (pack_payloads): `sent` shard by shard into `packed_sent`.
  void pack_shards() {
    size_t bound = 0;
    for (int j = 0; j < ranks(); ++j) bound += kernels::packed_bound(static_cast<size_t>(bytes[j]));
    packed_sent.resize(bound);
    int64_t out = 0;
    for (int j = 0; j < ranks(); ++j) {
      const size_t got = kernels::pack_payload(
          part(sent, offset(j), bytes[j]),
          std::span<std::byte>(packed_sent).subspan(static_cast<size_t>(out)));
      packed_sizes_out[j] = static_cast<int64_t>(got);
      out += packed_sizes_out[j];
    }
  }
  void unpack_received() {
    const int64_t mine = bytes[rank];
    int64_t in = 0;
    for (int i = 0; i < ranks(); in += packed_sizes_in[i], ++i)
      kernels::unpack_payload(part(packed_received, in, packed_sizes_in[i]),
                              part(received, i * mine, mine));
  }
  void pack_owned() {
    packed_owned.resize(kernels::packed_bound(owned.size()));
    packed_owned_size = static_cast<int64_t>(kernels::pack_payload(owned, packed_owned));
  }
  void unpack_gathered() {
    int64_t in = 0;
    for (int j = 0; j < ranks(); in += packed_gathered_sizes[j], ++j)
      kernels::unpack_payload(part(packed_gathered, in, packed_gathered_sizes[j]),
                              part(gathered, offset(j), bytes[j]));
  }
};

CocktailSgd::CocktailSgd(CocktailSgdOptions options) : options_(options) {
  const CocktailSgdOptions& o = options_;
  RELAXCC_ENFORCE(o.random_ratio > 0 && o.random_ratio <= 1, InvalidArgument,
                  "cocktail_sgd: random_ratio must be in (0, 1], got ", o.random_ratio);
  RELAXCC_ENFORCE(o.topk_ratio > 0 && o.topk_ratio <= 1, InvalidArgument,
                  "cocktail_sgd: topk_ratio must be in (0, 1], got ", o.topk_ratio);
  RELAXCC_ENFORCE(o.bits == 8 || o.bits == 4 || o.bits == 2 || o.bits == 1, InvalidArgument,
                  "cocktail_sgd: bits must be 8, 4, 2 or 1 (within 1..8), got ", o.bits);
  RELAXCC_ENFORCE(o.chunk >= 1, InvalidArgument, "cocktail_sgd: chunk must be >= 1, got ", o.chunk);
  RELAXCC_ENFORCE(o.warmup_steps >= 0, InvalidArgument,
                  "cocktail_sgd: warmup_steps must be >= 0, got ", o.warmup_steps);
  codec(0).validate();
}

AlgorithmCapabilities CocktailSgd::capabilities() const {
  AlgorithmCapabilities c;
  c.communicates_gradients = options_.warmup_steps > 0;
  return c;
}

kernels::CompressorConfig CocktailSgd::codec(int64_t step) const {
  kernels::CompressorConfig c;
  c.kind = kernels::CompressorKind::cocktail;
  c.ratio = options_.random_ratio;
  c.topk_ratio = options_.topk_ratio;
  c.bits = options_.bits;
  c.chunk = options_.chunk;
  c.rounding = options_.rounding;
  c.random_mode = options_.random_mode;
  c.approximate = false;  // the exact top-k: the same selection on every backend
  c.seed = options_.seed;
  c.step = static_cast<uint64_t>(step);
  return c;
}

void CocktailSgd::init(const AlgorithmContext& ctx) {
  ctx_ = ctx;
  FlatParameters flat;
  flat.bind(ctx, "cocktail_sgd");
  params_ = std::move(flat.tensors);
  param_at_ = std::move(flat.offsets);
  numel_ = flat.numel;
  const int n = ctx.comm->size();
  shard_begin_.assign(static_cast<size_t>(n), 0);
  shard_count_.assign(static_cast<size_t>(n), 0);
  for (int j = 0; j < n; ++j) {
    shard_count_[j] = numel_ / n + (j < numel_ % n ? 1 : 0);
    if (j > 0) shard_begin_[j] = shard_begin_[j - 1] + shard_count_[j - 1];
  }
  // Made once per communicator (init runs again when the Reducer re-plans
  // its buckets): a split, collective, so its key is this instance's alone.
  if (options_.pack_payloads && packed_parent_ != ctx.comm.get()) {
    packed_group_ = ctx.comm->split(0, ctx.comm->rank());
    packed_parent_ = ctx.comm.get();
  }
  if (server_.empty()) server_.assign(static_cast<size_t>(shard_count_[ctx.comm->rank()]), 0.0f);
  RELAXCC_ENFORCE_EQ(static_cast<int64_t>(server_.size()), shard_count_[ctx.comm->rank()],
                     InvalidArgument, "cocktail_sgd: the parameters changed size since init");
}

WorkPtr CocktailSgd::on_bucket_ready(const StepInfo& step, int bucket, const TensorView& data) {
  if (!warming_up(step)) return nullptr;  // a local step: gradients stay here
  AllreduceOptions o;
  o.op = ReduceOp::avg;
  o.label = "cocktail_sgd warmup bucket " + std::to_string(bucket);
  return ctx_.comm->allreduce(data, ctx_.exec, o);
}

void CocktailSgd::gather_params(std::vector<float>& flat) const {
  flat.resize(static_cast<size_t>(numel_));
  for (size_t i = 0; i < params_.size(); ++i) {
    const TensorView& v = (*ctx_.tensors)[static_cast<size_t>(params_[i])].view;
    std::memcpy(flat.data() + param_at_[i], v.data, v.nbytes());
  }
}

void CocktailSgd::before_optimizer_step(const StepInfo& step) {
  // The synchronised model the first delta is taken against: the model
  // every rank holds before its first local step.
  if (step.step == options_.warmup_steps && global_.empty()) gather_params(global_);
}

WorkPtr CocktailSgd::after_optimizer_step(const StepInfo& step) {
  if (warming_up(step)) return nullptr;
  check_not_failed();
  if (in_flight_) wait_exchange(std::chrono::milliseconds(-1));
  RELAXCC_ENFORCE_EQ(static_cast<int64_t>(global_.size()), numel_, InvalidArgument,
                     "cocktail_sgd: no synchronised model at step ", step.step,
                     " (resumed after warmup without load_state_dict?)");
  if (!exchange_) exchange_ = std::make_shared<Exchange>();
  apply_and_take_delta(*exchange_);
  try {
    start_exchange(step.step);
  } catch (const std::exception& error) {
    // A stage submitted before the failure may still run.
    fail_exchange("cocktail_sgd step " + std::to_string(step.step), error.what());
    throw;
  }
  return nullptr;
}

void CocktailSgd::apply_and_take_delta(Exchange& e) {
  e.delta.resize(static_cast<size_t>(numel_));
  // One pass over the model: x_r += a - C(d_r) and g += a for a pending
  // exchange, then d_r = x_r - g.
  const auto pass = [&](auto apply) {
    for (size_t i = 0; i < params_.size(); ++i) {
      const TensorView& v = (*ctx_.tensors)[static_cast<size_t>(params_[i])].view;
      float* x = v.as<float>();
      const size_t at = static_cast<size_t>(param_at_[i]);
      float* g = global_.data() + at;
      float* d = e.delta.data() + at;
      if constexpr (decltype(apply)::value) {
        const float* a = e.average.data() + at;
        const float* own = e.own.data() + at;
        for (int64_t j = 0; j < v.numel; ++j) {
          x[j] += a[j] - own[j];
          g[j] += a[j];
          d[j] = x[j] - g[j];
        }
      } else {
        for (int64_t j = 0; j < v.numel; ++j) d[j] = x[j] - g[j];
      }
    }
  };
  if (!pending_) return pass(std::false_type{});
  pass(std::true_type{});
  server_ = e.server;
  pending_ = false;
}

void CocktailSgd::start_exchange(int64_t step) {
  Communicator& comm = *ctx_.comm;
  const int n = comm.size(), r = comm.rank();
  const std::shared_ptr<Exchange> e = exchange_;
  // Written whole by the decodes (zeros where nothing was kept).
  e->own.resize(static_cast<size_t>(numel_));
  e->average.resize(static_cast<size_t>(numel_));
  e->cfg = codec(step);
  e->bytes.assign(static_cast<size_t>(n), 0);
  int64_t total = 0;
  for (int j = 0; j < n; ++j) {
    e->bytes[j] = static_cast<int64_t>(kernels::encoded_size(shard_count_[j], e->cfg));
    total += e->bytes[j];
  }
  const int64_t mine = e->bytes[r];
  e->sent.resize(static_cast<size_t>(total));
  e->received.resize(static_cast<size_t>(mine * n));
  e->owned.resize(static_cast<size_t>(mine));
  e->gathered.resize(static_cast<size_t>(total));
  e->server = server_;
  e->scratch.resize(static_cast<size_t>(shard_count_[r]));
  e->worker_ctx = e->owner_ctx = ctx_.exec;
  e->worker_ctx.rng = {options_.seed + 1 + static_cast<uint64_t>(r),
                       static_cast<uint64_t>(step) * static_cast<uint64_t>(numel_)};
  e->owner_ctx.rng = {options_.seed, e->worker_ctx.rng.offset};
  e->begin = shard_begin_;
  e->count = shard_count_;
  e->rank = r;
  e->label = "cocktail_sgd step " + std::to_string(step);
  if (options_.pack_payloads) {
    in_flight_ = start_packed_exchange(e);
    ++exchanges_;
    return;
  }

  // 1. Encode every shard of the delta, and decode what was sent.
  OpOptions o;
  o.label = e->label + " encode";
  WorkPtr encoded = comm.compute([e] { e->encode_shards(); }, o);
  // 2. Each shard's payload to its owner.
  AlltoallOptions a2a;
  a2a.label = e->label + " to owners";
  a2a.after = encoded;
  WorkPtr exchanged =
      comm.alltoallv(bytes_view(e->sent, e), e->bytes, bytes_view(e->received, e),
                     std::vector<int64_t>(static_cast<size_t>(n), mine), ctx_.exec, a2a);
  // 3. The owner averages its shard and re-encodes it with its residual.
  o.label = e->label + " owner";
  o.after = exchanged;
  WorkPtr reduced = comm.compute([e] { e->reduce_owned(); }, o);
  // 4. Every owner's payload to every rank, decoded into the average.
  AllgatherOptions ag;
  ag.label = e->label + " from owners";
  ag.after = reduced;
  WorkPtr gathered =
      comm.allgatherv(bytes_view(e->owned, e), bytes_view(e->gathered, e), e->bytes, ctx_.exec, ag);
  o.label = e->label + " decode";
  o.after = gathered;
  in_flight_ = comm.compute([e] { e->decode_gathered(); }, o);
  ++exchanges_;
}

namespace {

// A Work that failed with `error`: an operation submitted after it fails at
// once and tells its peers (its start sends them abort records).
WorkPtr failed_work(const std::string& what, std::exception_ptr error) {
  auto w = std::make_shared<Work>(what);
  w->complete(std::move(error));
  return w;
}

}  // namespace

WorkPtr CocktailSgd::start_packed_exchange(const std::shared_ptr<Exchange>& e) {
  // The same stages, each payload packed before it travels. Packed sizes
  // are known only once packed, so each transfer follows an exchange of
  // sizes and is submitted from that exchange's completion callback. The
  // stages run on a group of their own (every rank, in order), whose
  // operations only this chain submits: every rank submits them in the same
  // order whatever else runs on the communicator meanwhile. A rank that
  // cannot go on (sizes it does not trust, a failed allocation) still
  // submits the collectives its peers submit at that point, failed, so that
  // theirs fail at once too.
  const CommunicatorPtr comm = packed_group_;
  const int n = comm->size();
  const ExecContext exec = ctx_.exec;
  auto done = std::make_shared<Work>(e->label + " (packed payloads)");
  {
    std::lock_guard<std::mutex> lock(e->stages_mutex);
    e->stages.clear();
  }
  e->packed_sizes_out.assign(static_cast<size_t>(n), 0);
  e->packed_sizes_in.assign(static_cast<size_t>(n), 0);
  e->packed_gathered_sizes.assign(static_cast<size_t>(n), 0);
  // Reserved once: a resize within them never moves a buffer that an
  // abandoned receive may still write.
  const int64_t mine = e->bytes[e->rank];
  e->packed_received.reserve(static_cast<size_t>(n) *
                             kernels::packed_bound(static_cast<size_t>(mine)));
  size_t all_bound = 0;
  for (int j = 0; j < n; ++j) all_bound += kernels::packed_bound(static_cast<size_t>(e->bytes[j]));
  e->packed_gathered.reserve(all_bound);
  const auto i64_view = [e](std::vector<int64_t>& v) {
    return TensorView(v.data(), static_cast<int64_t>(v.size()), DType::i64, Device::host(), e);
  };

  // 1. Encode and pack every shard; 2. their sizes to the owners.
  OpOptions o;
  o.label = e->label + " encode";
  WorkPtr encoded = e->add_stage(comm->compute(
      [e] {
        e->encode_shards();
        e->pack_shards();
      },
      o));
  AlltoallOptions sizes;
  sizes.label = e->label + " sizes to owners";
  sizes.after = encoded;
  WorkPtr sized = e->add_stage(
      comm->alltoall(i64_view(e->packed_sizes_out), i64_view(e->packed_sizes_in), exec, sizes));
  sized->then([e, comm, exec, done, n, mine, i64_view](const Work& sizes_in) {
    if (sizes_in.exception()) return done->complete(sizes_in.exception());
    try {
      // 3. The packed shards to their owners; the owner unpacks, averages,
      // re-encodes and packs; 4. the owners' packed sizes to every rank.
      AlltoallOptions a2a;
      a2a.label = e->label + " to owners";
      const auto gather_owner_sizes = [&](WorkPtr after) {
        AllgatherOptions ag;
        ag.label = e->label + " sizes from owners";
        ag.after = std::move(after);
        return e->add_stage(
            comm->allgather(TensorView(&e->packed_owned_size, 1, DType::i64, Device::host(), e),
                            i64_view(e->packed_gathered_sizes), exec, ag));
      };
      int64_t in = 0, out = 0;
      try {
        in = Exchange::checked_sizes(
            e->packed_sizes_in, [mine](int) { return mine; }, a2a.label);
        for (int j = 0; j < n; ++j) out += e->packed_sizes_out[j];
        e->packed_received.resize(static_cast<size_t>(in));
      } catch (...) {
        // Both collectives the peers submit now, failed: theirs fail too.
        const WorkPtr failed = failed_work(a2a.label, std::current_exception());
        a2a.after = failed;
        std::vector<int64_t> none(static_cast<size_t>(n), 0);
        e->add_stage(comm->alltoallv(TensorView(nullptr, 0, DType::u8), none,
                                     TensorView(nullptr, 0, DType::u8), none, exec, a2a));
        gather_owner_sizes(failed);
        throw;
      }
      WorkPtr exchanged = e->add_stage(comm->alltoallv(
          TensorView(e->packed_sent.data(), out, DType::u8, Device::host(), e), e->packed_sizes_out,
          bytes_view(e->packed_received, e), e->packed_sizes_in, exec, a2a));
      OpOptions owner;
      owner.label = e->label + " owner";
      owner.after = exchanged;
      WorkPtr reduced = e->add_stage(comm->compute(
          [e] {
            e->unpack_received();
            e->reduce_owned();
            e->pack_owned();
          },
          owner));
      WorkPtr owner_sizes = gather_owner_sizes(reduced);
      owner_sizes->then([e, comm, exec, done, n](const Work& sizes_gathered) {
        if (sizes_gathered.exception()) return done->complete(sizes_gathered.exception());
        try {
          // 5. Every owner's packed payload to every rank, unpacked and
          // decoded into the average.
          AllgatherOptions ag;
          ag.label = e->label + " from owners";
          try {
            const int64_t all = Exchange::checked_sizes(
                e->packed_gathered_sizes, [&e](int j) { return e->bytes[j]; }, ag.label);
            e->packed_gathered.resize(static_cast<size_t>(all));
          } catch (...) {
            ag.after = failed_work(ag.label, std::current_exception());
            e->add_stage(comm->allgatherv(
                TensorView(nullptr, 0, DType::u8), TensorView(nullptr, 0, DType::u8),
                std::vector<int64_t>(static_cast<size_t>(n), 0), exec, ag));
            throw;
          }
          WorkPtr gathered = e->add_stage(comm->allgatherv(
              TensorView(e->packed_owned.data(), e->packed_owned_size, DType::u8, Device::host(),
                         e),
              bytes_view(e->packed_gathered, e), e->packed_gathered_sizes, exec, ag));
          OpOptions decode;
          decode.label = e->label + " decode";
          decode.after = gathered;
          WorkPtr decoded = e->add_stage(comm->compute(
              [e] {
                e->unpack_gathered();
                e->decode_gathered();
              },
              decode));
          decoded->then([done](const Work& last) { done->complete(last.exception()); });
        } catch (...) {
          done->complete(std::current_exception());
        }
      });
    } catch (...) {
      done->complete(std::current_exception());
    }
  });
  return done;
}

void CocktailSgd::wait_exchange(std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  const WorkPtr w = std::move(in_flight_);
  const std::shared_ptr<Exchange> e = exchange_;
  try {
    if (options_.pack_payloads) {
      // Each stage in turn: this thread drives its progress, and an
      // expiring wait poisons the group and names the stage. Between two,
      // the callback of the one before is submitting the next (callbacks do
      // not block: that gap is not held against the timeout).
      for (size_t next = 0; !w->is_completed();) {
        if (WorkPtr stage = e->stage_at(next)) {
          ++next;
          stage->wait(timeout_left(timeout, start));
        } else {
          w->wait_for(std::chrono::milliseconds(1));
        }
      }
    }
    w->wait(timeout_left(timeout, start));
  } catch (const Timeout& error) {
    fail_exchange(w->description(), error.what());
    throw;
  } catch (const std::exception& error) {
    fail_exchange(w->description(), error.what());
    // Otherwise the exchange's own error where it has one: a stage's may
    // only echo it (a stand-in submitted failed).
    if (w->is_completed() && w->exception()) std::rethrow_exception(w->exception());
    throw;
  }
  pending_ = true;
}

void CocktailSgd::fail_exchange(const std::string& what, const std::string& why) {
  // Its stages may still run and write the buffers: the next exchange gets
  // new ones. The ranks may now disagree on g: no more exchanges.
  exchange_.reset();
  in_flight_.reset();
  failed_ = detail::concat(what, " failed: ", why);
}

void CocktailSgd::drain(std::chrono::milliseconds timeout) {
  if (in_flight_) wait_exchange(timeout);
}

void CocktailSgd::check_not_failed() const {
  RELAXCC_ENFORCE(failed_.empty(), CommunicationError, "cocktail_sgd: ", failed_,
                  "; the ranks' synchronised models may differ now, so this instance makes no "
                  "more exchanges (resume from a checkpoint in a new one)");
}

void CocktailSgd::average_model(std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  drain(timeout);
  if (pending_) apply_and_take_delta(*exchange_);
  average_parameters(ctx_, "cocktail_sgd: exact model average", timeout_left(timeout, start));
}

StateDict CocktailSgd::state_dict() const {
  check_not_failed();
  RELAXCC_ENFORCE(!in_flight_, InvalidArgument,
                  "cocktail_sgd: state_dict() with an exchange in flight (call drain() first)");
  StateDict sd;
  sd.put_int("cocktail_sgd/exchanges", exchanges_);
  sd.put_floats("cocktail_sgd/global", global_);
  sd.put_floats("cocktail_sgd/server", server_);
  sd.put_int("cocktail_sgd/pending", pending_ ? 1 : 0);
  if (pending_) {
    sd.put_floats("cocktail_sgd/pending/own", exchange_->own);
    sd.put_floats("cocktail_sgd/pending/average", exchange_->average);
    sd.put_floats("cocktail_sgd/pending/server", exchange_->server);
  }
  return sd;
}

void CocktailSgd::load_state_dict(const StateDict& state) {
  RELAXCC_ENFORCE(!in_flight_, InvalidArgument,
                  "cocktail_sgd: load_state_dict() with an exchange in flight (drain first)");
  const auto sized = [&state](const std::string& key, int64_t numel) {
    std::vector<float> v = state.get_floats(key);
    RELAXCC_ENFORCE(v.empty() || static_cast<int64_t>(v.size()) == numel, InvalidArgument,
                    "cocktail_sgd: checkpoint entry '", key, "' has ", v.size(),
                    " elements, expected ", numel);
    return v;
  };
  const int64_t owned = shard_count_[ctx_.comm->rank()];
  failed_.clear();  // the state every rank resumes from
  exchanges_ = state.get_int("cocktail_sgd/exchanges");
  global_ = sized("cocktail_sgd/global", numel_);
  server_ = sized("cocktail_sgd/server", owned);
  RELAXCC_ENFORCE_EQ(static_cast<int64_t>(server_.size()), owned, InvalidArgument,
                     "cocktail_sgd: checkpoint's server residual");
  pending_ = state.get_int("cocktail_sgd/pending") != 0;
  if (pending_) {
    if (!exchange_) exchange_ = std::make_shared<Exchange>();
    exchange_->own = sized("cocktail_sgd/pending/own", numel_);
    exchange_->average = sized("cocktail_sgd/pending/average", numel_);
    exchange_->server = sized("cocktail_sgd/pending/server", owned);
  }
}

}  // namespace relaxcc::algorithms
