#include "relaxcc/relaxed/sparse_allreduce.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "../collectives/ring_schedule.h"
#include "relaxcc/errors.h"
#include "relaxcc/hash.h"

namespace relaxcc {

namespace {

using kernels::CompressorConfig;
using kernels::CompressorKind;

// ---- random-k -------------------------------------------------------------

WorkPtr random_k(Communicator& comm, const TensorView& x, const ExecContext& ctx,
                 const SparseAllreduceOptions& options) {
  const CompressorConfig& codec = options.codec;
  // The payload: a header, then the k kept values (no indices). Its size,
  // k and everything the ranks must agree on follow from the configuration.
  auto payload =
      std::make_shared<std::vector<unsigned char>>(kernels::encoded_size(x.numel, codec));
  const int64_t k = kernels::kept_elements(x.numel, codec);
  const auto h = static_cast<int64_t>(Fnv1a()
                                          .u64(static_cast<uint64_t>(x.numel))
                                          .u64(static_cast<uint64_t>(k))
                                          .u64(codec.seed)
                                          .u64(codec.step)
                                          .u64(std::bit_cast<uint64_t>(codec.ratio))
                                          .u64(static_cast<uint64_t>(codec.keep))
                                          .u64(static_cast<uint64_t>(codec.random_mode))
                                          .value() >>
                                      2);

  // Encoding runs inside a Work, after options.after (if any): an input the
  // codec refuses fails this rank's allreduces, and so every rank.
  kernels::ErrorFeedback* feedback = options.feedback;
  const WorkPtr start = options.after ? options.after : when_all({}, nullptr, "now");
  const WorkPtr encoded = start->then(
      [payload, feedback, x, codec, ctx](const Work& done) {
        if (done.exception()) return;
        const auto out = std::as_writable_bytes(std::span(payload->data(), payload->size()));
        if (feedback)
          feedback->compress(x, out, codec, ctx);
        else
          kernels::encode(x, out, codec, ctx);
      },
      "sparse_allreduce: encoding");

  // What every rank must agree on, as [h, -h]: its max is [h, -h] on every
  // rank only when all hashes are equal.
  auto check = std::make_shared<std::vector<int64_t>>(std::vector<int64_t>{h, -h});
  AllreduceOptions agree;
  static_cast<OpOptions&>(agree) = options;
  agree.op = ReduceOp::max;
  agree.after = encoded;
  WorkPtr agreed = comm.allreduce(TensorView(check->data(), 2, DType::i64, Device::host(), check),
                                  ExecContext::host(), agree);

  AllreduceOptions sum;
  static_cast<OpOptions&>(sum) = options;
  sum.op = options.op;
  sum.after = encoded;
  const TensorView values(payload->data() + sizeof(kernels::PayloadHeader), k, DType::f32,
                          Device::host(), payload);
  WorkPtr summed = comm.allreduce(values, ctx, sum);

  return when_all(
      {encoded, agreed, summed},
      [payload, check, h, x, ctx](Work&) {
        RELAXCC_ENFORCE((*check)[0] == h && (*check)[1] == -h, PeerMismatch,
                        "sparse_allreduce: ranks disagree on the random-k selection (seed, step, "
                        "ratio, keep or mode)");
        kernels::decode(std::as_bytes(std::span(payload->data(), payload->size())), x, ctx);
      },
      "sparse_allreduce");
}

// ---- top-k ----------------------------------------------------------------

// What an owner's step ended with, ahead of its payload in the all-gather.
struct OwnerStatus {
  enum Code : int32_t { ok = 0, corrupt = 1, mismatch = 2, invalid = 3, failed = 4 };
  int32_t code = ok;
  int32_t sender = -1;  // the rank whose payload failed; -1: the owner's own step
};
static_assert(sizeof(OwnerStatus) == 8);

// What one call keeps until it finishes (its buffers travel with its Works).
struct TopkCall {
  int rank = 0, size = 1;
  TensorView x;
  ExecContext ctx;
  CompressorConfig codec;
  ReduceOp op = ReduceOp::sum;
  kernels::ErrorFeedback* feedback = nullptr;
  kernels::ErrorFeedback* server_feedback = nullptr;
  // Shard j: count[j] elements from offset[j], kept[j] of them kept.
  std::vector<int64_t> count, offset, kept;
  // Shard j's payload (alltoallv block j, at most one per shard), and owner
  // j's slot in the all-gather: its OwnerStatus, then its payload.
  std::vector<int64_t> payload_bytes, payload_offset, slot_bytes, slot_offset;
  // The encoded shards of x (alltoallv input), this shard's payloads from
  // every rank (its output), and every owner's slot (allgatherv output).
  std::shared_ptr<std::vector<unsigned char>> sent, received, gathered;
  int sender = -1;           // the rank whose payload the owner is reading
  std::exception_ptr error;  // the owner's step's, if it failed
};

std::span<std::byte> bytes_of(std::vector<unsigned char>& v, int64_t offset, int64_t n) {
  return std::as_writable_bytes(std::span(v.data() + offset, static_cast<size_t>(n)));
}

// The codec of a shard's payload: exactly `kept` of its elements.
CompressorConfig shard_codec(const CompressorConfig& codec, int64_t kept) {
  CompressorConfig c = codec;
  c.keep = kept;
  return c;
}

// Step 1, inside a Work: the top k_j of each shard of x (with the worker's
// residual added) into `sent`. Checked before any residual changes.
void encode_shards(TopkCall& c) {
  const float* xs = c.x.as<float>();
  for (int64_t i = 0; i < c.x.numel; ++i)
    RELAXCC_ENFORCE(std::isfinite(xs[i]), InvalidArgument, "sparse_allreduce: element ", i, " is ",
                    xs[i], ", expected a finite value");
  std::vector<float> scratch(c.feedback ? static_cast<size_t>(c.count[0]) : 0);
  for (int j = 0; j < c.size; ++j) {
    const TensorView shard = c.x.slice(c.offset[j], c.count[j]);
    const auto begin = static_cast<size_t>(c.offset[j]);
    const auto count = static_cast<size_t>(c.count[j]);
    if (c.kept[j] == 0) {
      // Nothing of this shard travels: all of it waits in the residual.
      if (c.feedback)
        for (size_t i = 0; i < count; ++i) c.feedback->residual()[begin + i] += xs[begin + i];
      continue;
    }
    const std::span<std::byte> out = bytes_of(*c.sent, c.payload_offset[j], c.payload_bytes[j]);
    const CompressorConfig codec = shard_codec(c.codec, c.kept[j]);
    if (c.feedback)
      kernels::compress_with_feedback(shard,
                                      std::span(c.feedback->residual()).subspan(begin, count),
                                      std::span(scratch).first(count), out, codec, c.ctx);
    else
      kernels::encode(shard, out, codec, c.ctx);
  }
}

// Step 3: the owner's sum of its shard, its top k_r encoded once after the
// OwnerStatus of its slot.
void reduce_owned_shard(TopkCall& c) {
  const int r = c.rank;
  const int64_t count = c.count[r], k = c.kept[r], bytes = c.payload_bytes[r];
  if (k == 0) return;  // nothing was sent, nothing is kept
  std::vector<float> acc(static_cast<size_t>(count), 0.0f);
  const TensorView sum = TensorView::host(acc.data(), count);
  for (int i = 0; i < c.size; ++i) {
    c.sender = i;
    const std::span<const std::byte> payload = bytes_of(*c.received, i * bytes, bytes);
    const kernels::PayloadHeader h = kernels::read_header(payload);  // checks it and the size
    RELAXCC_ENFORCE(h.kind == CompressorKind::topk && h.n == count && h.k == k, CorruptPayload,
                    "sparse_allreduce: rank ", i, " sent shard ", r, " as ",
                    kernels::compressor_name(h.kind), " of ", h.k, " in ", h.n,
                    " elements, expected topk of ", k, " in ", count,
                    " (a corrupt payload, or ranks that disagree on the tensor)");
    // Indices in [0, count) and strictly increasing, finite values: checked
    // before anything is added.
    kernels::decode_accumulate(payload, sum, c.ctx);
  }
  c.sender = -1;
  if (c.op == ReduceOp::avg)
    for (float& v : acc) v /= static_cast<float>(c.size);
  // Finite contributions can still sum to Inf: refuse it here, naming where.
  for (int64_t i = 0; i < count; ++i)
    RELAXCC_ENFORCE(std::isfinite(acc[i]), InvalidArgument, "sparse_allreduce: the ",
                    c.op == ReduceOp::avg ? "average" : "sum", " of element ", c.offset[r] + i,
                    " overflows f32");
  const std::span<std::byte> out =
      bytes_of(*c.gathered, c.slot_offset[r] + sizeof(OwnerStatus), bytes);
  const CompressorConfig codec = shard_codec(c.codec, k);
  if (c.server_feedback)
    c.server_feedback->compress(sum, out, codec, c.ctx);
  else
    kernels::encode(sum, out, codec, c.ctx);
}

OwnerStatus status_of(const std::exception_ptr& error, int sender) {
  OwnerStatus s{OwnerStatus::failed, sender};
  try {
    std::rethrow_exception(error);
  } catch (const CorruptPayload&) {
    s.code = OwnerStatus::corrupt;
  } catch (const PeerMismatch&) {
    s.code = OwnerStatus::mismatch;
  } catch (const InvalidArgument&) {
    s.code = OwnerStatus::invalid;
  } catch (...) {
  }
  return s;
}

// Throws, as the same type on every rank, what owner `owner`'s step met.
void throw_owner_failure(int owner, const OwnerStatus& s) {
  const std::string where = detail::concat(
      "sparse_allreduce: the owner of shard ", owner, " (rank ", owner, ") failed",
      s.sender >= 0 ? detail::concat(" on the payload of rank ", s.sender) : std::string(),
      " (its own error says why)");
  switch (s.code) {
    case OwnerStatus::corrupt:
      RELAXCC_THROW(CorruptPayload, where, ": corrupt payload");
    case OwnerStatus::mismatch:
      RELAXCC_THROW(PeerMismatch, where, ": ranks disagree");
    case OwnerStatus::invalid:
      RELAXCC_THROW(InvalidArgument, where, ": input refused");
    case OwnerStatus::failed:
      RELAXCC_THROW(CommunicationError, where);
    default:
      RELAXCC_THROW(CorruptPayload, "sparse_allreduce: the status of shard ", owner,
                    "'s owner reads code ", s.code, " for sender ", s.sender,
                    ", expected a code in [0, 4] (sender -1 with code 0)");
  }
}

WorkPtr top_k(Communicator& comm, const TensorView& x, const ExecContext& ctx,
              const SparseAllreduceOptions& options) {
  const int n = comm.size(), r = comm.rank();
  auto c = std::make_shared<TopkCall>();
  c->rank = r;
  c->size = n;
  c->x = x;
  c->ctx = ctx;
  c->codec = options.codec;
  c->op = options.op;
  c->feedback = options.feedback;
  c->server_feedback = options.server_feedback;
  c->count = balanced_chunks(x.numel, n);
  // Balanced shares of k: k_j <= count[j] since k <= numel.
  c->kept = balanced_chunks(kernels::kept_elements(x.numel, options.codec), n);
  c->offset.assign(static_cast<size_t>(n), 0);
  c->payload_bytes.resize(static_cast<size_t>(n));
  c->payload_offset.assign(static_cast<size_t>(n), 0);
  c->slot_bytes.resize(static_cast<size_t>(n));
  c->slot_offset.assign(static_cast<size_t>(n), 0);
  for (int j = 0; j < n; ++j) {
    c->payload_bytes[j] = c->kept[j] > 0 ? static_cast<int64_t>(kernels::encoded_size(
                                               c->count[j], shard_codec(options.codec, c->kept[j])))
                                         : 0;
    c->slot_bytes[j] = static_cast<int64_t>(sizeof(OwnerStatus)) + c->payload_bytes[j];
    if (j > 0) {
      c->offset[j] = c->offset[j - 1] + c->count[j - 1];
      c->payload_offset[j] = c->payload_offset[j - 1] + c->payload_bytes[j - 1];
      c->slot_offset[j] = c->slot_offset[j - 1] + c->slot_bytes[j - 1];
    }
  }
  const int64_t sent_total = c->payload_offset[n - 1] + c->payload_bytes[n - 1];
  const int64_t gathered_total = c->slot_offset[n - 1] + c->slot_bytes[n - 1];
  c->sent = std::make_shared<std::vector<unsigned char>>(static_cast<size_t>(sent_total));
  c->received =
      std::make_shared<std::vector<unsigned char>>(static_cast<size_t>(n * c->payload_bytes[r]));
  c->gathered = std::make_shared<std::vector<unsigned char>>(static_cast<size_t>(gathered_total));

  // 1. Inside a Work (after options.after): an input the codec refuses fails
  // this rank's alltoallv, and so every rank.
  const WorkPtr start = options.after ? options.after : when_all({}, nullptr, "now");
  const WorkPtr encoded = start->then(
      [c](const Work& done) {
        if (!done.exception()) encode_shards(*c);
      },
      "sparse_allreduce: top-k selection");

  // 2. Each shard's pairs to its owner.
  AlltoallOptions a2a;
  static_cast<OpOptions&>(a2a) = options;
  a2a.after = encoded;
  const std::vector<int64_t> recv_counts(static_cast<size_t>(n), c->payload_bytes[r]);
  const TensorView sent(c->sent->data(), sent_total, DType::u8, Device::host(), c->sent);
  const TensorView received(c->received->data(), static_cast<int64_t>(c->received->size()),
                            DType::u8, Device::host(), c->received);
  WorkPtr exchanged = comm.alltoallv(sent, c->payload_bytes, received, recv_counts, ctx, a2a);

  // 3. The owner's sum and top-k. It never fails itself: what goes wrong
  // (here or in the alltoallv) becomes its status word, so the all-gather
  // below runs and every rank learns of it.
  WorkPtr reduced = exchanged->then(
      [c](const Work& done) {
        OwnerStatus status;
        try {
          if (const std::exception_ptr e = done.exception()) std::rethrow_exception(e);
          reduce_owned_shard(*c);
        } catch (...) {
          c->error = std::current_exception();
          status = status_of(c->error, c->sender);
        }
        std::memcpy(c->gathered->data() + c->slot_offset[c->rank], &status, sizeof status);
      },
      "sparse_allreduce: the owner's top-k");
  const WorkPtr own = reduced->then(
      [c](const Work&) {
        if (c->error) std::rethrow_exception(c->error);
      },
      "sparse_allreduce: the owner's result");

  // 4. The owners' slots to every rank, unchanged.
  AllgatherOptions ag;
  static_cast<OpOptions&>(ag) = options;
  ag.after = reduced;
  const TensorView mine(c->gathered->data() + c->slot_offset[r], c->slot_bytes[r], DType::u8,
                        Device::host(), c->gathered);
  const TensorView gathered(c->gathered->data(), gathered_total, DType::u8, Device::host(),
                            c->gathered);
  WorkPtr spread = comm.allgatherv(mine, gathered, c->slot_bytes, ctx, ag);

  // 5. Every owner's status, then every rank decodes the same bytes.
  RelaxedStats* stats = options.stats;
  return when_all(
      {encoded, own, spread},
      [c, stats](Work&) {
        const int ranks = c->size, me = c->rank;
        for (int j = 0; j < ranks; ++j) {
          OwnerStatus s;
          std::memcpy(&s, c->gathered->data() + c->slot_offset[j], sizeof s);
          if (s.code != OwnerStatus::ok || s.sender != -1) throw_owner_failure(j, s);
        }
        for (int j = 0; j < ranks; ++j) {
          const TensorView shard = c->x.slice(c->offset[j], c->count[j]);
          if (c->kept[j] == 0) {
            std::fill_n(shard.as<float>(), shard.numel, 0.0f);
            continue;
          }
          kernels::decode(
              bytes_of(*c->gathered, c->slot_offset[j] + sizeof(OwnerStatus), c->payload_bytes[j]),
              shard, c->ctx);
        }
        if (stats && ranks > 1) {
          // The alltoallv sends each peer its shard's payload and receives
          // this shard's; the all-gather ring sends every slot but the right
          // neighbour's own to the right neighbour and receives every slot
          // but this rank's from the left one.
          const auto all =
              static_cast<uint64_t>(c->slot_offset[ranks - 1] + c->slot_bytes[ranks - 1]);
          const int right = (me + 1) % ranks, left = (me + ranks - 1) % ranks;
          std::vector<RelaxedStats::Traffic> traffic;
          for (int j = 0; j < ranks; ++j) {
            if (j == me) continue;
            RelaxedStats::Traffic t{j, static_cast<uint64_t>(c->payload_bytes[j]),
                                    static_cast<uint64_t>(c->payload_bytes[me])};
            if (j == right) t.sent += all - static_cast<uint64_t>(c->slot_bytes[right]);
            if (j == left) t.received += all - static_cast<uint64_t>(c->slot_bytes[me]);
            traffic.push_back(t);
          }
          stats->add_round(traffic);
        }
      },
      "sparse_allreduce");
}

}  // namespace

int64_t sparse_allreduce_owned(int64_t numel, int rank, int size) {
  RELAXCC_ENFORCE(numel >= 0 && size >= 1 && rank >= 0 && rank < size, InvalidArgument,
                  "sparse_allreduce_owned: ", numel, " elements, rank ", rank, " of ", size);
  return balanced_chunks(numel, size)[static_cast<size_t>(rank)];
}

WorkPtr sparse_allreduce(Communicator& comm, const TensorView& x, const ExecContext& ctx,
                         const SparseAllreduceOptions& options) {
  x.check_valid("sparse_allreduce tensor");
  RELAXCC_ENFORCE(x.dtype == DType::f32 && x.device.is_host() && ctx.device.is_host(),
                  InvalidArgument, "sparse_allreduce: f32 host tensors, got ", dtype_name(x.dtype),
                  " on ", x.device);
  const CompressorConfig& codec = options.codec;
  const bool topk = codec.kind == CompressorKind::topk;
  RELAXCC_ENFORCE(topk || codec.kind == CompressorKind::randomk, InvalidArgument,
                  "sparse_allreduce: codec ", kernels::compressor_name(codec.kind),
                  ", expected randomk or topk");
  RELAXCC_ENFORCE(codec.ratio > 0 && codec.ratio <= 1, InvalidArgument,
                  "sparse_allreduce: ", kernels::compressor_name(codec.kind), " ratio ",
                  codec.ratio, ", expected a fraction in (0, 1]");
  codec.validate();
  RELAXCC_ENFORCE(options.op == ReduceOp::sum || options.op == ReduceOp::avg, InvalidArgument,
                  "sparse_allreduce: op ", options.op, ", expected sum or avg");
  RELAXCC_ENFORCE(
      !options.feedback || static_cast<int64_t>(options.feedback->residual().size()) == x.numel,
      InvalidArgument, "sparse_allreduce: error feedback for ",
      options.feedback ? options.feedback->residual().size() : 0, " elements, tensor of ", x.numel);
  if (!topk) {
    RELAXCC_ENFORCE(!options.server_feedback && !options.stats, InvalidArgument,
                    "sparse_allreduce: server_feedback and stats are for topk, got randomk");
    return random_k(comm, x, ctx, options);
  }
  const int64_t owned = sparse_allreduce_owned(x.numel, comm.rank(), comm.size());
  RELAXCC_ENFORCE(!options.server_feedback ||
                      static_cast<int64_t>(options.server_feedback->residual().size()) == owned,
                  InvalidArgument, "sparse_allreduce: server-side error feedback for ",
                  options.server_feedback ? options.server_feedback->residual().size() : 0,
                  " elements, expected the owned shard's ", owned, " (sparse_allreduce_owned)");
  return top_k(comm, x, ctx, options);
}

}  // namespace relaxcc
