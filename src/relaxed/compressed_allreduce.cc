#include "relaxcc/relaxed/compressed_allreduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <span>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "src/relaxed/compressed_shards.h"
#include "src/relaxed/tensor_backend.h"

namespace relaxcc {

namespace relaxed {

// The state's residuals as views on its device, and how a call puts its own
// in place.
struct StateAccess {
  static TensorView worker(CompressedAllreduceState& s) {
    return s.device_.is_host() ? TensorView::host(s.worker_.data(), s.numel_) : s.worker_device_;
  }
  static TensorView server(CompressedAllreduceState& s) {
    return s.device_.is_host() ? TensorView::host(s.server_.data(), s.owned_) : s.server_device_;
  }
  static int64_t owned(const CompressedAllreduceState& s) { return s.owned_; }
  // A call's residuals for this state, addressed by the views: host
  // vectors, or memory of the state's device.
  static void allocate(const CompressedAllreduceState& s, const TensorBackend& backend,
                       const ExecContext& ctx, std::vector<float>& worker,
                       std::vector<float>& server, TensorView& worker_view,
                       TensorView& server_view) {
    if (s.device_.is_host()) {
      worker.resize(static_cast<size_t>(s.numel_));
      server.resize(static_cast<size_t>(s.owned_));
      worker_view = TensorView::host(worker.data(), s.numel_);
      server_view = TensorView::host(server.data(), s.owned_);
    } else {
      worker_view = backend.zeros(s.numel_, DType::f32, ctx);
      server_view = backend.zeros(s.owned_, DType::f32, ctx);
    }
  }
  // Host residuals move from the call's vectors, device ones from its views.
  static void replace(CompressedAllreduceState& s, std::vector<float>& worker,
                      std::vector<float>& server, TensorView& worker_view,
                      TensorView& server_view) {
    if (s.device_.is_host()) {
      s.worker_ = std::move(worker);
      s.server_ = std::move(server);
    } else {
      s.worker_device_ = std::move(worker_view);
      s.server_device_ = std::move(server_view);
    }
  }
};

}  // namespace relaxed

namespace {

using kernels::CompressorConfig;
using kernels::CompressorKind;

using relaxed::dense;
using relaxed::Shards;

// What one call keeps until it finishes (its buffers travel with its Works).
// Shard j (the ring's balanced chunk j, or rank j's share, owned by rank j) is cut into pieces
// of at most `piece` elements; segment s is piece s of every shard, and each
// segment is exchanged, reduced and gathered on its own, so that segment s
// is on the wire while segment s + 1 is encoded and segment s - 1 reduced.
struct Call {
  int rank = 0, size = 1;
  TensorView x;
  ExecContext ctx;
  // The kernels and memory of x's device.
  std::shared_ptr<const relaxed::TensorBackend> backend;
  std::optional<CompressorConfig> codec;
  ReduceOp op = ReduceOp::sum;
  RobustAggregation robust;
  CompressedAllreduceState* state = nullptr;
  Shards shards{0, 1};
  // Unequal shares: the owners' payloads go straight to every rank (an
  // alltoallv from n copies of this rank's payload in `received`), not
  // around the ring.
  bool direct = false;
  int64_t piece = 1;  // elements per piece of a shard
  // With error feedback: the residuals this call leaves (worker: x's
  // elements; server: the owned shard's), put in place only once every
  // stage succeeded. On the host they live in the vectors, on a device in
  // the views' memory; the views address them either way.
  std::vector<float> worker_host, server_host;
  TensorView worker, server;
  struct Segment {
    // Per shard: the piece's first element in x, its elements, its payload
    // bytes and where the payload lies in `sent` and `gathered`.
    std::vector<int64_t> first, count, bytes, offset;
    int64_t total = 0;  // bytes of every shard's payload
    // The encoded pieces of x (alltoallv input), this rank's piece from
    // every rank (its output), and every owner's payload (allgatherv
    // output): u8 views of the call's payload memory, on x's device.
    TensorView sent, received, gathered;
  };
  std::vector<Segment> segments;
};

// Bytes [offset, offset + n) of a payload buffer, as a codec reads or writes them.
std::span<std::byte> bytes_of(const TensorView& buffer, int64_t offset, int64_t n) {
  return {static_cast<std::byte*>(buffer.data) + offset, static_cast<size_t>(n)};
}

// Bytes on the wire for `count` elements.
int64_t wire_bytes(int64_t count, const std::optional<CompressorConfig>& codec) {
  return codec ? static_cast<int64_t>(kernels::encoded_size(count, *codec))
               : count * static_cast<int64_t>(sizeof(float));
}

// out = the payload's values; an f32 payload must hold finite values only
// (`sender` names it in the CorruptPayload).
void read_payload(std::span<const std::byte> payload, const TensorView& out,
                  const std::optional<CompressorConfig>& codec,
                  const relaxed::TensorBackend& backend, const ExecContext& ctx, int sender) {
  if (codec) {
    backend.decode(payload, out, false, ctx);
    return;
  }
  // Checked before anything is written.
  float v = 0;
  const int64_t i = backend.first_non_finite(
      TensorView(const_cast<std::byte*>(payload.data()), out.numel, DType::f32, backend.device()),
      &v, ctx);
  RELAXCC_ENFORCE(i < 0, CorruptPayload, "compressed_allreduce: rank ", sender, " sent ", v,
                  " at element ", i, " of its f32 payload");
  if (out.numel > 0) backend.copy(out.data, payload.data(), payload.size(), ctx);
}

// Encodes `values` into `out`, with `residual` (same length, or empty: no
// error feedback) added first and updated with what the payload misses.
// Without a codec the values go as they are (nothing is missed).
void encode_with_feedback(const TensorView& values, const TensorView& residual,
                          std::span<std::byte> out, const std::optional<CompressorConfig>& codec,
                          const relaxed::TensorBackend& backend, const ExecContext& ctx) {
  if (!codec) {
    if (values.numel > 0) backend.copy(out.data(), values.data, values.nbytes(), ctx);
    return;
  }
  if (residual.numel == 0) {
    backend.encode(values, residual, TensorView(), out, *codec, ctx);
    return;
  }
  const TensorView scratch = backend.zeros(values.numel, DType::f32, ctx);
  backend.encode(values, residual, scratch, out, *codec, ctx);
  backend.finish(ctx);  // the scratch is released here
}

ExecContext with_rng(const ExecContext& ctx, uint64_t seed, uint64_t offset) {
  ExecContext c = ctx;
  c.rng.seed = seed;
  c.rng.offset = ctx.rng.offset + offset;
  return c;
}

// Robust average of the contributions (contribution i at values[i * count]).
void robust_average(const std::vector<float>& values, int n, int64_t count,
                    const RobustAggregation& robust, float* out) {
  std::vector<float> column(static_cast<size_t>(n));
  const auto at = [&](int i, int64_t k) { return values[static_cast<size_t>(i * count + k)]; };
  if (robust.kind == RobustAggregation::Kind::trimmed_mean) {
    for (int64_t k = 0; k < count; ++k) {
      for (int i = 0; i < n; ++i) column[i] = at(i, k);
      std::sort(column.begin(), column.end());
      double sum = 0;
      for (int i = robust.trim; i < n - robust.trim; ++i) sum += column[i];
      out[k] = static_cast<float>(sum / (n - 2 * robust.trim));
    }
    return;
  }
  // Centered clipping from the coordinate-wise median.
  for (int64_t k = 0; k < count; ++k) {
    for (int i = 0; i < n; ++i) column[i] = at(i, k);
    std::nth_element(column.begin(), column.begin() + n / 2, column.end());
    double median = column[n / 2];
    if (n % 2 == 0) {
      const float below = *std::max_element(column.begin(), column.begin() + n / 2);
      median = 0.5 * (median + below);
    }
    out[k] = static_cast<float>(median);
  }
  std::vector<double> step(static_cast<size_t>(count));
  for (int it = 0; it < robust.iterations; ++it) {
    std::fill(step.begin(), step.end(), 0.0);
    for (int i = 0; i < n; ++i) {
      double norm = 0;
      for (int64_t k = 0; k < count; ++k) norm += std::pow(double{at(i, k)} - out[k], 2);
      norm = std::sqrt(norm);
      const double scale = norm > robust.tau ? robust.tau / norm : 1.0;
      for (int64_t k = 0; k < count; ++k) step[k] += scale * (double{at(i, k)} - out[k]);
    }
    for (int64_t k = 0; k < count; ++k) out[k] = static_cast<float>(out[k] + step[k] / n);
  }
}

// Every payload of a stage has the same header (`h`: the payload's, read
// and checked against its size) as this rank's own (`own`) but for its
// element count (`count`), unless its sender disagrees on the
// codec or, with stochastic rounding, on the RNG position: then PeerMismatch
// naming both ranks.
void check_same_codec(const kernels::PayloadHeader& own, const kernels::PayloadHeader& h,
                      int64_t count, int sender, int me, const char* what) {
  const auto describe = [](const kernels::PayloadHeader& p) {
    return detail::concat(
        kernels::compressor_name(p.kind), " (", static_cast<int>(p.bits), " bits, chunk ", p.chunk,
        p.rounding == kernels::Rounding::stochastic
            ? detail::concat(", stochastic rounding at RNG seed ", p.seed, " offset ", p.step)
            : std::string(", rounding to nearest"),
        ")");
  };
  RELAXCC_ENFORCE(h.kind == own.kind && h.bits == own.bits && h.chunk == own.chunk &&
                      h.rounding == own.rounding && h.seed == own.seed && h.step == own.step,
                  PeerMismatch, "compressed_allreduce: rank ", sender, " ", what, " with ",
                  describe(h), ", rank ", me, " with ", describe(own));
  RELAXCC_ENFORCE(h.n == count, PeerMismatch, "compressed_allreduce: rank ", sender, " ", what,
                  " of ", h.n, " elements, rank ", me, " expects ", count);
}

// Step 3 for segment s: the owner's sum (or robust average) of its piece,
// encoded once into its slot of the segment's `gathered`.
void reduce_segment(Call& c, size_t s) {
  const Call::Segment& g = c.segments[s];
  const relaxed::TensorBackend& backend = *c.backend;
  const int r = c.rank;
  const int64_t count = g.count[r];
  const int64_t bytes = g.bytes[r];
  const TensorView acc = backend.zeros(count, DType::f32, c.ctx);
  const bool robust = c.robust.kind != RobustAggregation::Kind::none;
  // Robust aggregation (host tensors only) keeps every contribution apart.
  std::vector<float> each(robust ? static_cast<size_t>(count * c.size) : 0);
  const TensorView one =
      !robust && !c.codec ? backend.zeros(count, DType::f32, c.ctx) : TensorView();
  const kernels::PayloadHeader own =
      c.codec ? backend.read_header(bytes_of(g.received, r * bytes, bytes), c.ctx)
              : kernels::PayloadHeader{};
  for (int i = 0; i < c.size; ++i) {
    const std::span<const std::byte> payload = bytes_of(g.received, i * bytes, bytes);
    if (c.codec)
      check_same_codec(own, backend.read_header(payload, c.ctx), count, i, r,
                       "encodes its piece of shard");
    if (robust) {
      read_payload(payload, TensorView::host(each.data() + i * count, count), c.codec, backend,
                   c.ctx, i);
    } else if (c.codec) {
      backend.decode(payload, acc, true, c.ctx);
    } else {
      read_payload(payload, one, c.codec, backend, c.ctx, i);
      backend.add(acc, one, c.ctx);
    }
  }
  if (robust) {
    robust_average(each, c.size, count, c.robust, acc.as<float>());
  } else if (c.op == ReduceOp::avg) {
    backend.scale(acc, static_cast<float>(c.size), true, c.ctx);
  }
  // Finite contributions can still sum to Inf (a codec's encode refuses it
  // below; f32 goes as it is): refuse it here, naming where.
  float v = 0;
  const int64_t bad = backend.first_non_finite(acc, &v, c.ctx);
  RELAXCC_ENFORCE(bad < 0, InvalidArgument, "compressed_allreduce: the ",
                  c.op == ReduceOp::avg ? "average" : "sum", " of element ", g.first[r] + bad,
                  " overflows f32");
  TensorView residual;
  if (c.state) {
    const int64_t at = g.first[r] - c.shards.offset[r];
    residual = c.server.slice(at, count);
    backend.copy(residual.data, relaxed::StateAccess::server(*c.state).as<float>() + at,
                 static_cast<size_t>(count) * sizeof(float), c.ctx);
  }
  encode_with_feedback(acc, residual, bytes_of(g.gathered, g.offset[r], bytes), c.codec, backend,
                       with_rng(c.ctx, c.ctx.rng.seed, static_cast<uint64_t>(g.first[r])));
}

// Direct gather of segment s: n copies of this rank's payload in its
// `received` (read by then), the alltoallv's input.
void copy_own_payload(Call& c, size_t s) {
  const Call::Segment& g = c.segments[s];
  const int64_t bytes = g.bytes[c.rank];
  for (int j = 0; j < c.size && bytes > 0; ++j)
    c.backend->copy(bytes_of(g.received, j * bytes, bytes).data(),
                    bytes_of(g.gathered, g.offset[c.rank], bytes).data(),
                    static_cast<size_t>(bytes), c.ctx);
}

// Step 4 for segment s: the owners' payloads to every rank, unchanged.
WorkPtr spread_segment(Communicator& comm, const Call& c, size_t s, const OpOptions& options) {
  const Call::Segment& g = c.segments[s];
  return relaxed::spread_owner_slots(comm, c.direct,
                                     g.gathered.slice(g.offset[c.rank], g.bytes[c.rank]),
                                     g.received, g.gathered, g.bytes, c.ctx, options);
}

constexpr int64_t kMinPiece = 16384;
// Segments whose exchange (step 2) may be on the wire at once: enough that
// the gathers of the segments before them keep the links' other direction
// busy while a handshake waits behind queued data on a slow link.
constexpr size_t kExchangeWindow = 6;
constexpr int64_t kMaxSegments = 64;

// Cuts the shards into pieces of at most `piece` elements and sizes every
// segment's payloads (identically on every rank), and gives them buffers
// (throws Unsupported when `comm` cannot move memory of x's device).
void plan_segments(Communicator& comm, Call& c) {
  const int n = c.size;
  const int64_t longest = *std::max_element(c.shards.count.begin(), c.shards.count.end());
  // Pieces of at least kMinPiece elements (and whole codec chunks), at most
  // kMaxSegments per call: a call's collectives take 2 sequence numbers per
  // segment, and a lane's tags repeat after kLaneSeqs of them in flight.
  // Centered clipping takes its norms over a whole shard: one segment.
  if (c.robust.kind == RobustAggregation::Kind::centered_clip) c.piece = longest;
  c.piece = std::max({c.piece, kMinPiece, (longest + kMaxSegments - 1) / kMaxSegments});
  if (c.codec && c.codec->kind != CompressorKind::f16 && c.codec->kind != CompressorKind::bf16)
    c.piece = (c.piece + c.codec->chunk - 1) / c.codec->chunk * c.codec->chunk;
  const int64_t segments = std::max<int64_t>(1, (longest + c.piece - 1) / c.piece);
  c.segments.resize(static_cast<size_t>(segments));
  int64_t memory = 0;
  for (int64_t s = 0; s < segments; ++s) {
    Call::Segment& g = c.segments[static_cast<size_t>(s)];
    g.first.resize(static_cast<size_t>(n));
    g.count.resize(static_cast<size_t>(n));
    g.bytes.resize(static_cast<size_t>(n));
    g.offset.resize(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      const int64_t begin = std::min(s * c.piece, c.shards.count[j]);
      g.first[j] = c.shards.offset[j] + begin;
      g.count[j] = std::min(c.piece, c.shards.count[j] - begin);
      g.bytes[j] = wire_bytes(g.count[j], c.codec);
      g.offset[j] = g.total;
      g.total += g.bytes[j];
    }
    memory += 2 * g.total + n * g.bytes[c.rank];
  }
  // One allocation for every payload of the call, cut into the segments'
  // buffers.
  const TensorView all = c.backend->payload_memory(comm, memory, "compressed_allreduce");
  int64_t at = 0;
  const auto take = [&](int64_t bytes) {
    TensorView v(static_cast<unsigned char*>(all.data) + at, bytes, DType::u8, all.device,
                 all.owner);
    at += bytes;
    return v;
  };
  for (Call::Segment& g : c.segments) {
    g.sent = take(g.total);
    g.received = take(n * g.bytes[c.rank]);
    g.gathered = take(g.total);
  }
}

// Step 1 for segment s: every shard's piece, encoded for its owner.
void encode_segment(Call& c, size_t s) {
  const Call::Segment& g = c.segments[s];
  const relaxed::TensorBackend& backend = *c.backend;
  for (int j = 0; j < c.size; ++j) {
    const int64_t first = g.first[j];
    const int64_t count = g.count[j];
    TensorView residual;
    if (c.state) {
      residual = c.worker.slice(first, count);
      backend.copy(residual.data, relaxed::StateAccess::worker(*c.state).as<float>() + first,
                   static_cast<size_t>(count) * sizeof(float), c.ctx);
    }
    encode_with_feedback(
        c.x.slice(first, count), residual, bytes_of(g.sent, g.offset[j], g.bytes[j]), c.codec,
        backend, with_rng(c.ctx, c.ctx.rng.seed + 1 + static_cast<uint64_t>(c.rank), first));
  }
}

// Step 5: every rank decodes the same bytes into x, once every segment
// arrived: every payload is checked and decoded into scratch first, so
// that x (and the error-feedback state) change only when all of them are
// good; then x is written and the residuals put in place.
void decode_segments(Call& c) {
  const relaxed::TensorBackend& backend = *c.backend;
  int64_t longest = 0;
  for (const Call::Segment& g : c.segments)
    longest = std::max(longest, *std::max_element(g.count.begin(), g.count.end()));
  const TensorView scratch = backend.zeros(longest, DType::f32, c.ctx);
  for (int pass = 0; pass < 2; ++pass) {
    for (const Call::Segment& g : c.segments) {
      const kernels::PayloadHeader own =
          pass == 0 && c.codec
              ? backend.read_header(bytes_of(g.gathered, g.offset[c.rank], g.bytes[c.rank]), c.ctx)
              : kernels::PayloadHeader{};
      for (int j = 0; j < c.size; ++j) {
        const std::span<const std::byte> payload = bytes_of(g.gathered, g.offset[j], g.bytes[j]);
        TensorView out = c.x.slice(g.first[j], g.count[j]);
        if (pass == 0) {
          if (c.codec)
            check_same_codec(own, backend.read_header(payload, c.ctx), g.count[j], j, c.rank,
                             "encodes the sum of its piece");
          out = scratch.slice(0, g.count[j]);
        }
        read_payload(payload, out, c.codec, backend, c.ctx, j);
      }
    }
  }
  backend.finish(c.ctx);
  if (c.state)
    relaxed::StateAccess::replace(*c.state, c.worker_host, c.server_host, c.worker, c.server);
}

// Bytes each peer got from this rank and sent it, over every segment.
std::vector<RelaxedStats::Traffic> traffic(const Call& c) {
  std::vector<RelaxedStats::Traffic> out;
  for (const Call::Segment& g : c.segments)
    relaxed::add_owner_schedule_traffic(out, c.rank, g.bytes, g.bytes, c.direct);
  return out;
}

// The checks every rank makes before submitting anything (so that a bad
// call fails on every rank alike, at the call). `n` and `r`: the ranks and
// this rank of the communicator the shards are over.
void check_options(const TensorView& x, const ExecContext& ctx,
                   const CompressedAllreduceOptions& options, int n, int r, const char* what) {
  x.check_valid(what);
  RELAXCC_ENFORCE(x.dtype == DType::f32, InvalidArgument, what, ": f32 tensors, got ",
                  dtype_name(x.dtype), " on ", x.device);
  RELAXCC_ENFORCE(x.device == ctx.device, InvalidArgument, what, ": rank ", r, "'s tensor is on ",
                  x.device, ", its context on ", ctx.device, " (expected the same device)");
  RELAXCC_ENFORCE(x.device.is_host() || options.robust.kind == RobustAggregation::Kind::none,
                  Unsupported, what, ": rank ", r, ": robust aggregation of a tensor on ", x.device,
                  " (it runs on the host: host tensors only)");
  if (options.codec) {
    options.codec->validate();
    RELAXCC_ENFORCE(dense(options.codec->kind), InvalidArgument, what, ": codec ",
                    kernels::compressor_name(options.codec->kind),
                    " is sparse (expected f16, bf16, minmax or sign)");
    RELAXCC_ENFORCE(x.device.is_host() || options.codec->kind != CompressorKind::sign, Unsupported,
                    what, ": rank ", r, ": the sign codec on ", x.device,
                    " (the CUDA kernels encode f16, bf16 and minmax)");
  }
  RELAXCC_ENFORCE(options.op == ReduceOp::sum || options.op == ReduceOp::avg, InvalidArgument, what,
                  ": op ", options.op, ", expected sum or avg");
  RELAXCC_ENFORCE(options.segment_bytes >= static_cast<int64_t>(sizeof(float)), InvalidArgument,
                  what, ": segment_bytes ", options.segment_bytes, " (expected at least one f32)");
  const RobustAggregation& robust = options.robust;
  if (robust.kind != RobustAggregation::Kind::none) {
    RELAXCC_ENFORCE(options.op == ReduceOp::avg, InvalidArgument, what,
                    ": robust aggregation averages (op avg), got op ", options.op);
    RELAXCC_ENFORCE(robust.kind != RobustAggregation::Kind::trimmed_mean ||
                        (robust.trim >= 0 && 2 * robust.trim < n),
                    InvalidArgument, what, ": trimmed mean of ", n, " ranks with trim ",
                    robust.trim, " (expected 0 <= 2 trim < ranks)");
    RELAXCC_ENFORCE(robust.kind != RobustAggregation::Kind::centered_clip ||
                        (robust.tau > 0 && robust.iterations >= 1),
                    InvalidArgument, what, ": centered clip with tau ", robust.tau, " and ",
                    robust.iterations, " iterations (expected tau > 0, iterations >= 1)");
  }
  if (r < 0) return;  // not a member of the shards' communicator: no state
  RELAXCC_ENFORCE(!options.state || options.state->numel() == x.numel, InvalidArgument, what,
                  ": error-feedback state for ", options.state ? options.state->numel() : 0,
                  " elements, tensor of ", x.numel);
  RELAXCC_ENFORCE(!options.state || relaxed::StateAccess::owned(*options.state) ==
                                        Shards(x.numel, n, options.shares).count[r],
                  InvalidArgument, what,
                  ": error-feedback state made for another communicator or other shares");
  RELAXCC_ENFORCE(!options.state || options.state->device() == x.device, InvalidArgument, what,
                  ": rank ", r, "'s error-feedback state is on ",
                  options.state ? options.state->device() : x.device, ", the tensor on ", x.device);
}

// The schedule on a backend that is not stepped (the host): every stage is
// submitted now, in the same order on every rank, each to start once the
// stage before it completed. The local stages run off the thread that moves
// the data (Communicator::compute): segment s + 1 is encoded, and segment
// s - 1 reduced, while segment s is on the wire. A stage that fails (an
// input the codec refuses, a payload that does not decode) fails the
// collective after it, and so every rank.
WorkPtr submit_stages(Communicator& comm, const std::shared_ptr<Call>& c,
                      const CompressedAllreduceOptions& options) {
  const int n = c->size, r = c->rank;
  const ExecContext& ctx = c->ctx;
  OpOptions local;
  local.priority = options.priority;
  local.label = options.label;
  std::vector<WorkPtr> stages, submitted, exchanges;
  const auto submit = [&submitted](WorkPtr w) {
    submitted.push_back(w);
    return w;
  };
  try {
    WorkPtr encoded = options.after;
    for (size_t s = 0; s < c->segments.size(); ++s) {
      Call::Segment& g = c->segments[s];
      // 1. Encode every shard's piece (after the previous segment's encoding).
      local.after = encoded;
      encoded = submit(comm.compute([c, s] { encode_segment(*c, s); }, local));
      // 2. Each piece's payload to its shard's owner, once the exchange
      // kExchangeWindow segments back completed: active operations share
      // the links fairly, so without the window every segment's exchange
      // would end together, late, and no segment's gather would overlap the
      // later exchanges.
      AlltoallOptions a2a;
      static_cast<OpOptions&>(a2a) = options;
      a2a.after = s >= kExchangeWindow ? when_all({encoded, exchanges[s - kExchangeWindow]},
                                                  nullptr, "compressed_allreduce: exchange window")
                                       : encoded;
      const std::vector<int64_t> recv_counts(static_cast<size_t>(n), g.bytes[r]);
      WorkPtr exchanged =
          submit(comm.alltoallv(g.sent, g.bytes, g.received, recv_counts, ctx, a2a));
      exchanges.push_back(exchanged);
      // 3. The owner's sum of its piece, encoded once.
      local.after = exchanged;
      WorkPtr reduced = submit(comm.compute(
          [c, s] {
            reduce_segment(*c, s);
            if (c->direct) copy_own_payload(*c, s);
          },
          local));
      // 4. The owners' payloads to every rank, unchanged.
      OpOptions spread_options = options;
      spread_options.after = reduced;
      WorkPtr spread = submit(spread_segment(comm, *c, s, spread_options));
      // The exchange too: a mismatch it finds is the call's error, not the
      // reduction's "a stage it runs after failed".
      stages.insert(stages.end(), {encoded, exchanged, reduced, spread});
    }
    // 5. Every rank decodes the same bytes into x, once every segment
    // arrived (x is left as it was when any stage failed).
    local.after = when_all(stages, nullptr, "compressed_allreduce: every segment");
    stages.push_back(submit(comm.compute([c] { decode_segments(*c); }, local)));
  } catch (...) {
    // A submission refused half way (the communicator was poisoned
    // meanwhile): nothing submitted yet, the error goes to the caller;
    // otherwise the call's Work fails with it once what was submitted
    // drained (it holds x and the state until then).
    if (submitted.empty()) throw;
    auto refused = std::make_shared<Work>("compressed_allreduce: submission");
    refused->complete(std::current_exception());
    submitted.push_back(std::move(refused));
    return when_all(std::move(submitted), nullptr, "compressed_allreduce");
  }
  RelaxedStats* stats = options.stats;
  return when_all(
      std::move(stages),
      [c, stats](Work&) {
        if (stats) stats->add_round(traffic(*c));
      },
      "compressed_allreduce");
}

// The schedule on a stepped backend (a CUDA device): the same stages and
// collectives in the same order, run on the calling thread. Every segment's
// encoding is followed by the submission of its alltoallv, so segment s is
// on the wire while segment s + 1 is encoded; then each segment is reduced
// once its alltoallv completed and its allgatherv submitted; then
// everything is decoded. A local stage that fails does not stop the
// schedule: this rank keeps its error, sends payloads that decode as
// corrupt (every byte 0xff: a bad header, or NaN as f32) in every later
// transfer, and fails at the end, while its peers fail on its payloads
// (CorruptPayload). A transfer that fails (a timeout, a poisoned
// communicator) ends the schedule with its error.
WorkPtr step_stages(Communicator& comm, const std::shared_ptr<Call>& c,
                    const CompressedAllreduceOptions& options) {
  const int n = c->size, r = c->rank;
  const ExecContext& ctx = c->ctx;
  const relaxed::TensorBackend& backend = *c->backend;
  auto done = std::make_shared<Work>("compressed_allreduce");
  std::exception_ptr failed;  // this rank's first failed local stage
  const auto run_local = [&](const std::function<void()>& stage, const TensorView& out) {
    if (!failed) {
      try {
        stage();
        backend.finish(ctx);
      } catch (...) {
        failed = std::current_exception();
      }
    }
    if (failed) {
      backend.fill(out.data, 0xff, out.nbytes(), ctx);
      backend.finish(ctx);
    }
  };
  std::vector<WorkPtr> exchanged, spread;
  try {
    if (options.after) {
      try {
        options.after->wait();
      } catch (...) {
        failed = std::current_exception();
      }
    }
    for (size_t s = 0; s < c->segments.size(); ++s) {
      Call::Segment& g = c->segments[s];
      // 1. Encode every shard's piece; 2. each piece's payload to its owner.
      run_local([&] { encode_segment(*c, s); }, g.sent);
      AlltoallOptions a2a;
      static_cast<OpOptions&>(a2a) = options;
      a2a.after = nullptr;
      const std::vector<int64_t> recv_counts(static_cast<size_t>(n), g.bytes[r]);
      exchanged.push_back(comm.alltoallv(g.sent, g.bytes, g.received, recv_counts, ctx, a2a));
    }
    for (size_t s = 0; s < c->segments.size(); ++s) {
      Call::Segment& g = c->segments[s];
      // 3. The owner's sum of its piece, encoded once; 4. the owners'
      // payloads to every rank.
      exchanged[s]->wait();
      const TensorView own = g.gathered.slice(g.offset[r], g.bytes[r]);
      run_local([&] { reduce_segment(*c, s); }, own);
      if (c->direct) {
        copy_own_payload(*c, s);
        backend.finish(ctx);
      }
      OpOptions spread_options = options;
      spread_options.after = nullptr;
      spread.push_back(spread_segment(comm, *c, s, spread_options));
    }
    for (const WorkPtr& w : spread) w->wait();
    // 5. Every rank decodes the same bytes into x (left as it was when any
    // stage failed).
    if (failed) std::rethrow_exception(failed);
    decode_segments(*c);
    if (options.stats) options.stats->add_round(traffic(*c));
    done->complete(nullptr);
  } catch (...) {
    done->complete(std::current_exception());
  }
  return done;
}

}  // namespace

CompressedAllreduceState::CompressedAllreduceState(int64_t numel, int rank, int size, Device device,
                                                   const std::vector<double>& shares)
    : numel_(numel), owned_(0), device_(device) {
  RELAXCC_ENFORCE(numel >= 0 && size >= 1 && rank >= 0 && rank < size, InvalidArgument,
                  "CompressedAllreduceState: ", numel, " elements, rank ", rank, " of ", size);
  const Shards shards(numel, size, shares);
  owned_ = shards.count[rank];
  if (device.is_host()) {
    worker_.assign(static_cast<size_t>(numel), 0.0f);
    server_.assign(static_cast<size_t>(owned_), 0.0f);
    return;
  }
  const std::unique_ptr<relaxed::TensorBackend> backend = relaxed::tensor_backend(device);
  ExecContext ctx;
  ctx.device = device;
  worker_device_ = backend->zeros(numel, DType::f32, ctx);
  server_device_ = backend->zeros(owned_, DType::f32, ctx);
  backend->finish(ctx);
}

void CompressedAllreduceState::save(StateDict& dict, const std::string& prefix) const {
  if (device_.is_host()) {
    dict.put_floats(prefix + "worker", worker_);
    dict.put_floats(prefix + "server", server_);
    return;
  }
  const std::unique_ptr<relaxed::TensorBackend> backend = relaxed::tensor_backend(device_);
  ExecContext ctx;
  ctx.device = device_;
  std::vector<float> worker(static_cast<size_t>(numel_)), server(static_cast<size_t>(owned_));
  backend->copy(worker.data(), worker_device_.data, worker_device_.nbytes(), ctx);
  backend->copy(server.data(), server_device_.data, server_device_.nbytes(), ctx);
  backend->finish(ctx);
  dict.put_floats(prefix + "worker", worker);
  dict.put_floats(prefix + "server", server);
}

void CompressedAllreduceState::load(const StateDict& dict, const std::string& prefix) {
  std::vector<float> worker = dict.get_floats(prefix + "worker");
  std::vector<float> server = dict.get_floats(prefix + "server");
  RELAXCC_ENFORCE(static_cast<int64_t>(worker.size()) == numel_ &&
                      static_cast<int64_t>(server.size()) == owned_,
                  InvalidArgument, "CompressedAllreduceState::load(", prefix, "): ", worker.size(),
                  " worker and ", server.size(), " server residuals, expected ", numel_, " and ",
                  owned_);
  if (device_.is_host()) {
    worker_ = std::move(worker);
    server_ = std::move(server);
    return;
  }
  const std::unique_ptr<relaxed::TensorBackend> backend = relaxed::tensor_backend(device_);
  ExecContext ctx;
  ctx.device = device_;
  backend->copy(worker_device_.data, worker.data(), worker_device_.nbytes(), ctx);
  backend->copy(server_device_.data, server.data(), server_device_.nbytes(), ctx);
  backend->finish(ctx);
}

WorkPtr compressed_allreduce(Communicator& comm, const TensorView& x, const ExecContext& ctx,
                             const CompressedAllreduceOptions& options) {
  if (options.auto_codec) {
    const AutoCodec& chooser = *options.auto_codec;
    RELAXCC_ENFORCE(chooser.ranks() == comm.size(), InvalidArgument, "compressed_allreduce: rank ",
                    comm.rank(), "'s auto codec was calibrated for ", chooser.ranks(),
                    " ranks, the communicator has ", comm.size());
    CompressedAllreduceOptions o = options;
    o.auto_codec = nullptr;
    o.codec = chooser.choose(x.numel).codec;
    if (o.codec || o.robust.kind != RobustAggregation::Kind::none || !o.shares.empty())
      return compressed_allreduce(comm, x, ctx, o);
    check_options(x, ctx, o, comm.size(), comm.rank(), "compressed_allreduce");
    AllreduceOptions a;
    static_cast<OpOptions&>(a) = o;
    a.op = o.op;
    return relaxed::counted_allreduce(comm, x, ctx, a, o.stats);
  }
  check_options(x, ctx, options, comm.size(), comm.rank(), "compressed_allreduce");
  const int n = comm.size(), r = comm.rank();
  std::shared_ptr<const relaxed::TensorBackend> backend = relaxed::tensor_backend(x.device);

  // One rank: the sum and the average are x itself; nothing to quantize.
  if (n == 1) {
    // A communicator that cannot move x's memory is refused all the same.
    backend->check_communicator(comm, "compressed_allreduce");
    if (backend->stepped()) return backend->after({options.after}, nullptr, "compressed_allreduce");
    return options.after ? options.after->then([](const Work&) {}, "compressed_allreduce")
                         : when_all({}, nullptr, "compressed_allreduce");
  }

  auto c = std::make_shared<Call>();
  c->rank = r;
  c->size = n;
  c->x = x;
  c->ctx = ctx;
  c->backend = std::move(backend);
  c->codec = options.codec;
  if (c->codec) {
    // With stochastic rounding the call's RNG position travels in every
    // payload's header (dense codecs leave its seed and step fields unread
    // otherwise), so ranks that would draw different random numbers get
    // PeerMismatch; with rounding to nearest they carry 0.
    const bool stochastic = c->codec->rounding == kernels::Rounding::stochastic;
    c->codec->seed = stochastic ? ctx.rng.seed : 0;
    c->codec->step = stochastic ? ctx.rng.offset : 0;
  }
  c->op = options.op;
  c->robust = options.robust;
  c->state = options.state;
  c->shards = Shards(x.numel, n, options.shares);
  c->direct = !options.shares.empty();
  c->piece = std::max<int64_t>(1, options.segment_bytes / static_cast<int64_t>(sizeof(float)) / n);
  plan_segments(comm, *c);
  if (c->state)
    relaxed::StateAccess::allocate(*c->state, *c->backend, ctx, c->worker_host, c->server_host,
                                   c->worker, c->server);
  // Every collective of the call carries the split in its header: ranks
  // whose shard counts differ fail with PeerMismatch naming them, even where
  // the payloads' sizes happen to match (a codec that rounds sizes up).
  CompressedAllreduceOptions agreed = options;
  Fnv1a split;
  split.u64(options.agree).byte(c->direct ? 1 : 0);
  for (const int64_t k : c->shards.count) split.u64(static_cast<uint64_t>(k));
  agreed.agree = split.value();
  agreed.agree_what = detail::concat(
      "the shard counts (CompressedAllreduceOptions::shares, or the tensor's size)",
      options.agree != 0 ? " or " : "", options.agree != 0 ? options.agree_what : "");
  return c->backend->stepped() ? step_stages(comm, c, agreed) : submit_stages(comm, c, agreed);
}

WorkPtr hierarchical_compressed_allreduce(Communicator& comm, const HierarchicalComms& comms,
                                          const TensorView& x, const ExecContext& ctx,
                                          const CompressedAllreduceOptions& options) {
  RELAXCC_ENFORCE(comms.intra != nullptr, InvalidArgument,
                  "hierarchical_compressed_allreduce: no node communicator (build_hierarchy)");
  RELAXCC_ENFORCE(options.robust.kind == RobustAggregation::Kind::none, InvalidArgument,
                  "hierarchical_compressed_allreduce: robust aggregation needs every rank's "
                  "contribution apart (use compressed_allreduce)");
  // Every rank checks what the leaders' call would, before submitting (the
  // state only where it is used).
  check_options(x, ctx, options, comms.inter ? comms.inter->size() : 1,
                comms.inter ? comms.inter->rank() : -1, "hierarchical_compressed_allreduce");
  // Full precision within the node, summed.
  AllreduceOptions local;
  static_cast<OpOptions&>(local) = options;
  local.op = ReduceOp::sum;
  WorkPtr summed = comms.intra->allreduce(x, ctx, local);
  // Compressed across the nodes' leaders, after it.
  WorkPtr across = summed;
  if (comms.inter) {
    CompressedAllreduceOptions o = options;
    o.op = ReduceOp::sum;
    o.after = summed;
    across = compressed_allreduce(*comms.inter, x, ctx, o);
  }
  // The leader's result to its node.
  BroadcastOptions b;
  static_cast<OpOptions&>(b) = options;
  b.root = 0;
  b.after = across;
  WorkPtr spread = comms.intra->broadcast(x, ctx, b);
  const float scale = options.op == ReduceOp::avg ? 1.0f / static_cast<float>(comm.size()) : 1.0f;
  std::shared_ptr<const relaxed::TensorBackend> backend = relaxed::tensor_backend(x.device);
  const relaxed::TensorBackend& runner = *backend;
  return runner.after(
      {summed, across, spread},
      [x, ctx, scale, backend = std::move(backend)] {
        if (scale == 1.0f) return;
        backend->scale(x, scale, false, ctx);
        backend->finish(ctx);
      },
      "hierarchical_compressed_allreduce");
}

}  // namespace relaxcc
