#include "relaxcc/relaxed/sparse_allreduce.h"

#include <algorithm>
#include <array>
#include <bit>
#include <memory>
#include <numeric>
#include <span>
#include <vector>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "src/relaxed/compressed_shards.h"
#include "src/relaxed/tensor_backend.h"

namespace relaxcc {

namespace {

using kernels::CompressorConfig;
using kernels::CompressorKind;
using relaxed::TensorBackend;

// Error feedback that a call changes only if it succeeds: the call works on
// a copy of the residual taken when it encodes (begin(): a host vector, or
// memory of the backend's device), and commit() puts it in place (a swap,
// or a copy back) once the call is known to have succeeded everywhere.
struct PendingResidual {
  kernels::ErrorFeedback* feedback = nullptr;
  std::vector<float> next;  // the copy, on the host
  TensorView copy;          // the copy, on the backend's device (host: `next`)
  bool begun = false;

  // The call's copy; an empty view without feedback.
  TensorView begin(const TensorBackend& backend, const ExecContext& ctx) {
    if (!feedback) return {};
    const auto n = std::ssize(feedback->residual());
    if (backend.device().is_host()) {
      next = feedback->residual();
      copy = TensorView::host(next.data(), n);
    } else {
      copy = backend.zeros(n, DType::f32, ctx);
      backend.copy(copy.data, feedback->residual().data(), copy.nbytes(), ctx);
    }
    begun = true;
    return copy;
  }
  void commit(const TensorBackend& backend, const ExecContext& ctx) {
    if (!begun) return;
    if (backend.device().is_host()) {
      next.swap(feedback->residual());
      return;
    }
    backend.copy(feedback->residual().data(), copy.data, copy.nbytes(), ctx);
    backend.finish(ctx);
  }
};

OpOptions op_options(const OpOptions& options, WorkPtr after) {
  OpOptions o = options;
  o.after = std::move(after);
  return o;
}

// ---- random-k -------------------------------------------------------------

// What every rank of a random-k call must agree on: the selection's hash.
int64_t randomk_hash(int64_t numel, int64_t k, const CompressorConfig& codec) {
  return static_cast<int64_t>(Fnv1a()
                                  .u64(static_cast<uint64_t>(numel))
                                  .u64(static_cast<uint64_t>(k))
                                  .u64(codec.seed)
                                  .u64(codec.step)
                                  .u64(std::bit_cast<uint64_t>(codec.ratio))
                                  .u64(static_cast<uint64_t>(codec.keep))
                                  .u64(static_cast<uint64_t>(codec.random_mode))
                                  .value() >>
                              2);
}

// What one random-k call keeps until it finishes: its payload (a header,
// then the k kept values, no indices; its size, k and everything the ranks
// must agree on follow from the configuration), in payload memory of x's
// device.
struct RandomkCall {
  TensorView x;
  ExecContext ctx;
  std::shared_ptr<const TensorBackend> backend;
  CompressorConfig codec;
  int64_t k = 0;
  int64_t hash = 0;
  TensorView payload;
  PendingResidual residual;

  RandomkCall(Communicator& comm, const TensorView& tensor, const ExecContext& context,
              const SparseAllreduceOptions& options, std::shared_ptr<const TensorBackend> x_backend)
      : x(tensor),
        ctx(context),
        backend(std::move(x_backend)),
        codec(options.codec),
        k(kernels::kept_elements(x.numel, codec)),
        hash(randomk_hash(x.numel, k, codec)),
        payload(backend->payload_memory(comm,
                                        static_cast<int64_t>(kernels::encoded_size(x.numel, codec)),
                                        "sparse_allreduce")) {
    residual.feedback = options.feedback;
  }

  std::span<std::byte> bytes() const {
    return {static_cast<std::byte*>(payload.data), static_cast<size_t>(payload.numel)};
  }
  // The k kept values, which the ranks sum.
  TensorView values() const {
    return TensorView(static_cast<unsigned char*>(payload.data) + sizeof(kernels::PayloadHeader), k,
                      DType::f32, payload.device, payload.owner);
  }
};

// The k kept values of x (plus the residual, left holding what they miss)
// into the payload. Throws InvalidArgument for an input the codec refuses.
void encode_randomk(RandomkCall& c) {
  const TensorBackend& backend = *c.backend;
  const TensorView residual = c.residual.begin(backend, c.ctx);
  const TensorView scratch =
      residual.numel > 0 ? backend.zeros(c.x.numel, DType::f32, c.ctx) : TensorView();
  backend.encode(c.x, residual, scratch, c.bytes(), c.codec, c.ctx);
  backend.finish(c.ctx);  // the scratch is released here
}

// x = the summed payload (0 where nothing was kept); the residual put in place.
void decode_randomk(RandomkCall& c) {
  const TensorBackend& backend = *c.backend;
  backend.decode(c.bytes(), c.x, false, c.ctx);
  c.residual.commit(backend, c.ctx);
  backend.finish(c.ctx);
}

// Random-k on the host: the encoding runs off the engine thread, after
// options.after (if any); an input the codec refuses fails this rank's
// allreduces, and so every rank. One allreduce sums the kept values in
// place, one of [h, -h] with max checks the selection.
WorkPtr random_k(Communicator& comm, const TensorView& x, const ExecContext& ctx,
                 const SparseAllreduceOptions& options) {
  auto call =
      std::make_shared<RandomkCall>(comm, x, ctx, options, relaxed::tensor_backend(x.device));
  const int64_t h = call->hash;
  const WorkPtr encoded =
      comm.compute([call] { encode_randomk(*call); }, op_options(options, options.after));

  // What every rank must agree on, as [h, -h]: its max is [h, -h] on every
  // rank only when all hashes are equal.
  auto check = std::make_shared<std::vector<int64_t>>(std::vector<int64_t>{h, -h});
  AllreduceOptions agree;
  static_cast<OpOptions&>(agree) = op_options(options, encoded);
  agree.op = ReduceOp::max;
  WorkPtr agreed = relaxed::counted_allreduce(
      comm, TensorView(check->data(), 2, DType::i64, Device::host(), check), ExecContext::host(),
      agree, options.stats);

  AllreduceOptions sum;
  static_cast<OpOptions&>(sum) = op_options(options, encoded);
  sum.op = options.op;
  WorkPtr summed = relaxed::counted_allreduce(comm, call->values(), ctx, sum, options.stats);

  return when_all(
      {encoded, agreed, summed},
      [call, check, h](Work&) {
        RELAXCC_ENFORCE((*check)[0] == h && (*check)[1] == -h, PeerMismatch,
                        "sparse_allreduce: ranks disagree on the random-k selection (seed, step, "
                        "ratio, keep or mode)");
        decode_randomk(*call);
      },
      "sparse_allreduce");
}

// ---- on a device ----------------------------------------------------------

// The frame of both device schedules, stepped on the calling thread: the
// tensor backend of x's device, which refuses (throws, here) a communicator
// that cannot move that device's memory (MPI); then, once options.after
// completed, body(backend). Returns a completed Work: a success when body
// returns, else failed with what body or the wait on options.after threw.
template <typename Body>
WorkPtr on_device(Communicator& comm, const TensorView& x, const SparseAllreduceOptions& options,
                  Body&& body) {
  const std::shared_ptr<const TensorBackend> backend = relaxed::tensor_backend(x.device);
  backend->check_communicator(comm, "sparse_allreduce");
  auto done = std::make_shared<Work>("sparse_allreduce");
  try {
    if (options.after) options.after->wait();
    body(backend);
    done->complete(nullptr);
  } catch (...) {
    done->complete(std::current_exception());
  }
  return done;
}

// Random-k on device tensors over a communicator that moves device memory
// (NCCL), stepped on the calling thread as the device compressed allreduce
// is (the CUDA kernels validate on the device and read their flags back):
// the same encoding and decoding as on the host, with the payload in
// memory from comm.allocate() and the residual of error feedback
// (kernels::ErrorFeedback, host memory) copied to the device before the
// encode and back once the call succeeded. An NCCL collective cannot fail
// because a stage before it did, so a rank whose encode fails keeps taking
// part (so no peer waits on it: its payload is every byte 0xff, NaN) and
// throws its own error; the check is an allreduce of three integers [h,
// -h, 1 + the highest rank whose encode failed (0: none)] with max, and
// the others throw CommunicationError naming that rank. x and the residual
// are untouched on every rank unless the call succeeds. Returns a completed
// Work.
WorkPtr random_k_device(Communicator& comm, const TensorView& x, const ExecContext& ctx,
                        const SparseAllreduceOptions& options) {
  return on_device(comm, x, options, [&](std::shared_ptr<const TensorBackend> backend) {
    RandomkCall c(comm, x, ctx, options, std::move(backend));
    const TensorBackend& b = *c.backend;
    std::exception_ptr encode_error;
    try {
      encode_randomk(c);
    } catch (...) {
      encode_error = std::current_exception();
      b.fill(c.payload.data, 0xff, c.payload.nbytes(), ctx);
    }
    const TensorView check = comm.allocate(3, DType::i64);
    const std::array<int64_t, 3> mine = {c.hash, -c.hash, encode_error ? comm.rank() + 1 : 0};
    b.copy(check.data, mine.data(), sizeof mine, ctx);
    AllreduceOptions agree;
    static_cast<OpOptions&>(agree) = op_options(options, nullptr);
    agree.op = ReduceOp::max;
    WorkPtr agreed = relaxed::counted_allreduce(comm, check, ctx, agree, options.stats);
    AllreduceOptions sum;
    static_cast<OpOptions&>(sum) = op_options(options, nullptr);
    sum.op = options.op;
    WorkPtr summed = relaxed::counted_allreduce(comm, c.values(), ctx, sum, options.stats);
    agreed->wait();
    summed->wait();
    std::array<int64_t, 3> all{};
    b.copy(all.data(), check.data, sizeof all, ctx);
    b.finish(ctx);
    if (encode_error) std::rethrow_exception(encode_error);
    RELAXCC_ENFORCE(all[2] == 0, CommunicationError, "sparse_allreduce: rank ", comm.rank(),
                    ": rank ", all[2] - 1, " could not encode its tensor (its own error says why)");
    RELAXCC_ENFORCE(all[0] == c.hash && all[1] == -c.hash, PeerMismatch,
                    "sparse_allreduce: ranks disagree on the random-k selection (seed, step, "
                    "ratio, keep or mode)");
    decode_randomk(c);
  });
}

// ---- top-k ----------------------------------------------------------------

// Ahead of each alltoallv block: what the owner checks before it reads the
// payload behind it.
struct BlockPrefix {
  uint64_t fingerprint = 0;  // of the sender's call (TopkCall::fingerprint)
  int32_t code = 0;          // the sender's selection: an OwnerStatus::Code
  int32_t reserved = 0;
};
static_assert(sizeof(BlockPrefix) == 16);

// What an owner's step ended with, ahead of its payload in the all-gather.
struct OwnerStatus {
  enum Code : int32_t { ok = 0, corrupt = 1, mismatch = 2, invalid = 3, failed = 4 };
  // Where it failed: the owner's own sum and selection, its alltoallv, or
  // rank `sender`'s call (fingerprint), input (its selection) or payload.
  enum Stage : int32_t { own = 0, exchange = 1, call = 2, input = 3, payload = 4 };
  int32_t code = ok;
  int32_t stage = own;
  int32_t sender = -1;  // -1 for the stages own and exchange
  int32_t reserved = 0;
};
static_assert(sizeof(OwnerStatus) == 16);

OwnerStatus::Code code_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const CorruptPayload&) {
    return OwnerStatus::corrupt;
  } catch (const PeerMismatch&) {
    return OwnerStatus::mismatch;
  } catch (const InvalidArgument&) {
    return OwnerStatus::invalid;
  } catch (...) {
    return OwnerStatus::failed;
  }
}

// Unequal shards (shares): k_j = floor(k count[j] / numel), plus 1 for
// the first k - sum of them shards with room for it (k_j < count[j]),
// counted from shard step mod n. So k_j <= count[j] and the shares sum to
// k (k <= numel).
std::vector<int64_t> proportional_shares_of(int64_t k, const std::vector<int64_t>& count,
                                            uint64_t step) {
  const auto n = static_cast<int64_t>(count.size());
  const int64_t numel = std::accumulate(count.begin(), count.end(), int64_t{0});
  std::vector<int64_t> kept(count.size(), 0);
  int64_t given = 0;
  for (int64_t j = 0; j < n; ++j) {
    // k count[j] may not fit 64 bits: in 128.
    __extension__ using Wide = __int128;
    kept[j] = static_cast<int64_t>(static_cast<Wide>(k) * count[j] / std::max<int64_t>(numel, 1));
    given += kept[j];
  }
  const auto first = static_cast<int64_t>(step % static_cast<uint64_t>(n));
  for (int64_t i = 0; given < k && i < 2 * n; ++i) {
    const int64_t j = (first + i) % n;
    if (kept[j] < count[j]) {
      ++kept[j];
      ++given;
    }
  }
  return kept;
}

// Equal shards: shard j's share of k: k_j = floor(k / n), plus 1 for k mod n of the m
// shards with room for it (all n, or the first numel mod n when floor(k /
// n) already fills the smaller shards): shard j < m takes it when (j -
// step) mod m < k mod n. Rotating with the step sends every shard in turn
// when k < n. So k_j <= count[j] and the shares sum to k.
std::vector<int64_t> shares_of(int64_t k, const std::vector<int64_t>& count, uint64_t step) {
  const auto n = static_cast<int64_t>(count.size());
  const int64_t base = k / n, extra = k % n;
  std::vector<int64_t> kept(count.size(), base);
  if (extra == 0) return kept;
  const auto room = static_cast<int64_t>(
      std::count_if(count.begin(), count.end(), [&](int64_t c) { return c > base; }));
  const auto rotation = static_cast<int64_t>(step % static_cast<uint64_t>(room));
  for (int64_t j = 0; j < room; ++j)
    if ((j - rotation + room) % room < extra) ++kept[static_cast<size_t>(j)];
  return kept;
}

// The codec of a shard's payload: exactly `kept` of its elements.
CompressorConfig shard_codec(const CompressorConfig& codec, int64_t kept) {
  CompressorConfig c = codec;
  c.keep = kept;
  return c;
}

// What one call keeps until it finishes (its buffers travel with its Works).
struct TopkCall {
  int rank, size;
  TensorView x;
  ExecContext ctx;
  // The kernels and memory of x's device.
  std::shared_ptr<const TensorBackend> backend;
  CompressorConfig codec;
  ReduceOp op;
  // Everything the ranks' layouts and results depend on: element count, k,
  // op, ratio, keep, step and exact or approximate selection.
  uint64_t fingerprint;
  // Shard j: shards.count[j] elements from shards.offset[j], kept[j] of them
  // kept, in a payload of payload_bytes[j] (0 when kept[j] is 0).
  relaxed::Shards shards;
  std::vector<int64_t> kept, payload_bytes;
  // Alltoallv block j: a BlockPrefix, then shard j's payload. All-gather
  // slot j: owner j's OwnerStatus, then its payload.
  std::vector<int64_t> block_bytes, block_offset, slot_bytes, slot_offset;
  // The blocks of x (alltoallv input), this shard's blocks from every rank
  // (its output), and every owner's slot (allgatherv output): u8 views of
  // the call's payload memory, on x's device. Unequal shares: the slots go
  // straight to every rank, by an alltoallv from n copies of this rank's
  // slot (`spread`).
  TensorView sent, received, gathered, spread;
  bool direct = false;
  // Worker-side and server-side error feedback, committed only when every
  // owner's status is ok; with either, the encoders' scratch (the largest
  // shard's elements).
  PendingResidual worker, server;
  TensorView scratch;
  std::exception_ptr encode_error;    // this rank's selection (step 1)
  std::exception_ptr exchange_error;  // this rank's alltoallv
  std::exception_ptr owner_error;     // this rank's owner step (step 3), or its alltoallv's

  TopkCall(Communicator& comm, const TensorView& tensor, const ExecContext& context,
           const SparseAllreduceOptions& options, std::shared_ptr<const TensorBackend> x_backend)
      : rank(comm.rank()),
        size(comm.size()),
        x(tensor),
        ctx(context),
        backend(std::move(x_backend)),
        codec(options.codec),
        op(options.op),
        shards(tensor.numel, comm.size(), options.shares),
        direct(!options.shares.empty()) {
    const int64_t k = kernels::kept_elements(x.numel, codec);
    fingerprint = Fnv1a()
                      .bytes("topk")
                      .u64(static_cast<uint64_t>(x.numel))
                      .u64(static_cast<uint64_t>(k))
                      .u64(static_cast<uint64_t>(op))
                      .u64(std::bit_cast<uint64_t>(codec.ratio))
                      .u64(static_cast<uint64_t>(codec.keep))
                      .u64(codec.step)
                      .u64(codec.approximate ? 1 : 0)
                      .value();
    // Unequal shares: the shard layout, too.
    if (!options.shares.empty())
      for (int64_t count : shards.count)
        fingerprint = Fnv1a().u64(fingerprint).u64(static_cast<uint64_t>(count)).value();
    kept = direct ? proportional_shares_of(k, shards.count, codec.step)
                  : shares_of(k, shards.count, codec.step);
    worker.feedback = options.feedback;
    server.feedback = options.server_feedback;
    const auto n = static_cast<size_t>(size);
    payload_bytes.assign(n, 0);
    block_bytes.assign(n, 0);
    block_offset.assign(n, 0);
    slot_bytes.assign(n, 0);
    slot_offset.assign(n, 0);
    for (size_t j = 0; j < n; ++j) {
      if (kept[j] > 0)
        payload_bytes[j] = static_cast<int64_t>(
            kernels::encoded_size(shards.count[j], shard_codec(codec, kept[j])));
      block_bytes[j] = static_cast<int64_t>(sizeof(BlockPrefix)) + payload_bytes[j];
      slot_bytes[j] = static_cast<int64_t>(sizeof(OwnerStatus)) + payload_bytes[j];
      if (j > 0) {
        block_offset[j] = block_offset[j - 1] + block_bytes[j - 1];
        slot_offset[j] = slot_offset[j - 1] + slot_bytes[j - 1];
      }
    }
    // One allocation for the three buffers, each starting on a 64-byte
    // boundary.
    const int64_t sent_bytes = block_offset.back() + block_bytes.back();
    const int64_t received_bytes = size * block_bytes[rank];
    const int64_t gathered_bytes = slot_offset.back() + slot_bytes.back();
    const int64_t spread_bytes = direct ? size * slot_bytes[rank] : 0;
    const auto aligned = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };
    const TensorView all = backend->payload_memory(
        comm,
        aligned(sent_bytes) + aligned(received_bytes) + aligned(gathered_bytes) + spread_bytes,
        "sparse_allreduce");
    const auto part = [&all](int64_t offset, int64_t bytes) {
      return TensorView(static_cast<unsigned char*>(all.data) + offset, bytes, DType::u8,
                        all.device, all.owner);
    };
    sent = part(0, sent_bytes);
    received = part(aligned(sent_bytes), received_bytes);
    gathered = part(aligned(sent_bytes) + aligned(received_bytes), gathered_bytes);
    spread =
        part(aligned(sent_bytes) + aligned(received_bytes) + aligned(gathered_bytes), spread_bytes);
    if (worker.feedback || server.feedback)
      scratch = backend->zeros(*std::max_element(shards.count.begin(), shards.count.end()),
                               DType::f32, ctx);
  }

  // Byte `offset` of a buffer.
  static std::byte* at(const TensorView& buffer, int64_t offset) {
    return static_cast<std::byte*>(buffer.data) + offset;
  }
  std::span<std::byte> payload_sent(int j) const {
    return {at(sent, block_offset[j] + static_cast<int64_t>(sizeof(BlockPrefix))),
            static_cast<size_t>(payload_bytes[j])};
  }
  std::span<std::byte> payload_received(int from) const {
    return {at(received, from * block_bytes[rank] + static_cast<int64_t>(sizeof(BlockPrefix))),
            static_cast<size_t>(payload_bytes[rank])};
  }
  std::span<std::byte> payload_gathered(int j) const {
    return {at(gathered, slot_offset[j] + static_cast<int64_t>(sizeof(OwnerStatus))),
            static_cast<size_t>(payload_bytes[j])};
  }
  // Owner j's slot of `gathered`.
  TensorView slot(int j) const {
    return TensorView(at(gathered, slot_offset[j]), slot_bytes[j], DType::u8, gathered.device,
                      gathered.owner);
  }
};

// Names shard j's payload from rank `from` (step 3) or from the all-gather
// (step 5) in an error.
std::string payload_name(int j, int from, bool gathered) {
  return gathered ? detail::concat("the all-gathered payload of shard ", j,
                                   " (from its owner, rank ", from, ")")
                  : detail::concat("the payload of rank ", from, " for shard ", j);
}

// A header that read_header accepted, checked against the layout.
void check_layout(const TopkCall& c, const kernels::PayloadHeader& h, int j, int from,
                  bool gathered) {
  const int64_t count = c.shards.count[j], k = c.kept[j];
  RELAXCC_ENFORCE(h.kind == CompressorKind::topk && h.n == count && h.k == k, CorruptPayload,
                  "sparse_allreduce: ", payload_name(j, from, gathered), " reads ",
                  kernels::compressor_name(h.kind), " of ", h.k, " in ", h.n,
                  " elements, expected topk of ", k, " in ", count);
}

// That payload's header, checked against the layout: a top-k payload of
// kept[j] in count[j] elements (read_header checks the rest of the header
// and the size). CorruptPayload otherwise.
void check_header(const TopkCall& c, std::span<const std::byte> payload, int j, int from,
                  bool gathered) {
  kernels::PayloadHeader h;
  try {
    h = c.backend->read_header(payload, c.ctx);
  } catch (const CorruptPayload& e) {
    RELAXCC_THROW(CorruptPayload, "sparse_allreduce: ", payload_name(j, from, gathered), ": ",
                  e.message());
  }
  check_layout(c, h, j, from, gathered);
}

// A shard of which nothing travels (shard `j`, elements from `begin`): no
// encoder sees it, so x (plus its residual) is checked for finite values
// here, and waits in the residual (if any; `scratch` as long as the shard).
void keep_in_residual(const TopkCall& c, const TensorView& shard, const TensorView& residual,
                      const TensorView& scratch, int64_t begin) {
  const TensorBackend& backend = *c.backend;
  if (residual.numel == 0) {
    float v = 0;
    const int64_t i = backend.first_non_finite(shard, &v, c.ctx);
    RELAXCC_ENFORCE(i < 0, InvalidArgument, "sparse_allreduce: element ", begin + i, " is ", v,
                    ", expected a finite value");
    return;
  }
  // x + residual in the scratch, checked before the residual takes it.
  backend.copy(scratch.data, residual.data, residual.nbytes(), c.ctx);
  backend.add(scratch, shard, c.ctx);
  float e = 0;
  const int64_t i = backend.first_non_finite(scratch, &e, c.ctx);
  if (i >= 0) {
    float xi = 0, ri = 0;
    backend.copy(&xi, shard.as<const float>() + i, sizeof xi, c.ctx);
    backend.copy(&ri, residual.as<const float>() + i, sizeof ri, c.ctx);
    backend.finish(c.ctx);
    RELAXCC_THROW(InvalidArgument, "sparse_allreduce: element ", begin + i, " is ", xi,
                  " plus its residual ", ri, ", expected a finite value");
  }
  backend.copy(residual.data, scratch.data, residual.nbytes(), c.ctx);
}

// Step 1: the top k_j of each shard of x (plus the worker's residual) into
// the blocks. Throws InvalidArgument for an input the codec refuses; the
// worker's residual changes only in its PendingResidual.
void encode_shards(TopkCall& c) {
  const TensorBackend& backend = *c.backend;
  const TensorView residual = c.worker.begin(backend, c.ctx);
  const bool feedback = residual.numel > 0;
  for (int j = 0; j < c.size; ++j) {
    const int64_t begin = c.shards.offset[j], count = c.shards.count[j];
    const TensorView shard = c.x.slice(begin, count);
    const TensorView mine = feedback ? residual.slice(begin, count) : TensorView();
    const TensorView scratch = feedback ? c.scratch.slice(0, count) : TensorView();
    if (c.kept[j] == 0) {
      keep_in_residual(c, shard, mine, scratch, begin);
      continue;
    }
    try {
      backend.encode(shard, mine, scratch, c.payload_sent(j), shard_codec(c.codec, c.kept[j]),
                     c.ctx);
    } catch (const InvalidArgument& e) {
      RELAXCC_THROW(InvalidArgument, "sparse_allreduce: shard ", j, " (elements from ", begin, ")",
                    c.worker.feedback ? " plus its residual" : "", ": ", e.message());
    }
  }
}

// Step 1 as it runs: the selection, then every block's prefix, which
// carries the selection's failure (if any) to every owner.
void select_shards(TopkCall& c) {
  BlockPrefix prefix{c.fingerprint, OwnerStatus::ok, 0};
  try {
    encode_shards(c);
  } catch (...) {
    c.encode_error = std::current_exception();
    prefix.code = code_of(c.encode_error);
  }
  for (int j = 0; j < c.size; ++j)
    c.backend->copy(TopkCall::at(c.sent, c.block_offset[j]), &prefix, sizeof prefix, c.ctx);
  c.backend->finish(c.ctx);  // the prefix's host memory is read by the copies
}

// Step 3's check of every sender's call and selection (the blocks'
// prefixes, in rank order), before any payload is read: false, with s
// naming the sender, when a sender's selection failed (the sender throws
// its own error with the details); PeerMismatch or CorruptPayload, with s
// naming the sender and stage, for a prefix of another call or out of range.
bool senders_ok(const TopkCall& c, const std::vector<BlockPrefix>& prefixes, OwnerStatus& s) {
  for (int i = 0; i < c.size; ++i) {
    const BlockPrefix& p = prefixes[static_cast<size_t>(i)];
    s.sender = i;
    s.stage = OwnerStatus::call;
    RELAXCC_ENFORCE(p.fingerprint == c.fingerprint, PeerMismatch, "sparse_allreduce: rank ", i,
                    " calls with fingerprint ", p.fingerprint, ", rank ", c.rank, " with ",
                    c.fingerprint,
                    ": they differ in the element count, k, op, ratio, keep, step or selection");
    s.stage = OwnerStatus::input;
    RELAXCC_ENFORCE(p.code >= OwnerStatus::ok && p.code <= OwnerStatus::failed && p.reserved == 0,
                    CorruptPayload, "sparse_allreduce: the block prefix of rank ", i,
                    " reads code ", p.code, " and reserved ", p.reserved,
                    ", expected a code in [0, 4] and 0");
    if (p.code != OwnerStatus::ok) {
      s.code = p.code;
      return false;
    }
  }
  s.sender = -1;
  s.stage = OwnerStatus::own;
  return true;
}

// Step 3: the owner's check of every block of its shard, its sum, and its
// top k_r encoded once after the OwnerStatus of its slot. Returns that
// status; a failure of this rank's own is kept in c.owner_error.
OwnerStatus reduce_owned_shard(TopkCall& c) {
  const TensorBackend& backend = *c.backend;
  const int r = c.rank;
  OwnerStatus s;
  try {
    if (c.exchange_error) {
      s.stage = OwnerStatus::exchange;
      std::rethrow_exception(c.exchange_error);
    }
    std::vector<BlockPrefix> prefixes(static_cast<size_t>(c.size));
    for (int i = 0; i < c.size; ++i)
      backend.copy(&prefixes[static_cast<size_t>(i)],
                   TopkCall::at(c.received, i * c.block_bytes[r]), sizeof(BlockPrefix), c.ctx);
    backend.finish(c.ctx);
    if (!senders_ok(c, prefixes, s)) return s;
    const int64_t count = c.shards.count[r], k = c.kept[r];
    if (k == 0) return s;  // nothing was sent, nothing is kept
    const TensorView sum = backend.zeros(count, DType::f32, c.ctx);
    for (int i = 0; i < c.size; ++i) {
      s.sender = i;
      s.stage = OwnerStatus::payload;
      const std::span<const std::byte> payload = c.payload_received(i);
      check_header(c, payload, r, i, /*gathered=*/false);
      // Indices in [0, count) and strictly increasing, finite values: checked
      // before anything is added.
      backend.decode(payload, sum, /*accumulate=*/true, c.ctx);
    }
    s.sender = -1;
    s.stage = OwnerStatus::own;
    if (c.op == ReduceOp::avg) backend.scale(sum, static_cast<float>(c.size), true, c.ctx);
    try {
      // The encoder refuses a sum (plus residual) that overflowed f32.
      const TensorView residual = c.server.begin(backend, c.ctx);
      backend.encode(sum, residual, residual.numel > 0 ? c.scratch.slice(0, count) : TensorView(),
                     c.payload_gathered(r), shard_codec(c.codec, k), c.ctx);
    } catch (const InvalidArgument& e) {
      RELAXCC_THROW(InvalidArgument, "sparse_allreduce: the ",
                    c.op == ReduceOp::avg ? "average" : "sum", " of shard ", r, " (elements from ",
                    c.shards.offset[r], ")", c.server.feedback ? " plus its server residual" : "",
                    " overflows f32: ", e.message());
    }
    backend.finish(c.ctx);  // the sum's memory is released here
  } catch (...) {
    c.owner_error = std::current_exception();
    s.code = code_of(c.owner_error);
  }
  return s;
}

// Step 3 as it runs: the owner's status into its slot, ahead of its payload.
void reduce_into_slot(TopkCall& c) {
  const OwnerStatus status = reduce_owned_shard(c);
  c.backend->copy(TopkCall::at(c.gathered, c.slot_offset[c.rank]), &status, sizeof status, c.ctx);
  c.backend->finish(c.ctx);
}

// Throws, as the same type on every rank, the failure that owner j's
// status word reports, with this rank's own error where it is the source.
[[noreturn]] void throw_owner_failure(const TopkCall& c, int j, const OwnerStatus& s) {
  std::string what;
  switch (s.stage) {
    case OwnerStatus::own:
      what = detail::concat("the owner of shard ", j, " (rank ", j, ") failed in its own step");
      break;
    case OwnerStatus::exchange:
      what = detail::concat("the alltoallv failed on the owner of shard ", j, " (rank ", j, ")");
      break;
    case OwnerStatus::call:
      what =
          detail::concat("rank ", s.sender, " calls with another element count, k, op, ratio, ",
                         "keep, step or selection than the owner of shard ", j, " (rank ", j, ")");
      break;
    case OwnerStatus::input:
      what = detail::concat("rank ", s.sender, "'s selection failed (reported to the owner of ",
                            "shard ", j, ", rank ", j, ")");
      break;
    default:
      what = detail::concat("the payload of rank ", s.sender, " for shard ", j,
                            " does not decode on its owner (rank ", j, ")");
  }
  if (j == c.rank && c.owner_error)
    what += detail::concat(": ", detail::message_of(c.owner_error));
  else if (s.stage == OwnerStatus::input && s.sender == c.rank && c.encode_error)
    what += detail::concat(": ", detail::message_of(c.encode_error));
  switch (s.code) {
    case OwnerStatus::corrupt:
      RELAXCC_THROW(CorruptPayload, "sparse_allreduce: ", what);
    case OwnerStatus::mismatch:
      RELAXCC_THROW(PeerMismatch, "sparse_allreduce: ", what);
    case OwnerStatus::invalid:
      RELAXCC_THROW(InvalidArgument, "sparse_allreduce: ", what);
    default:
      RELAXCC_THROW(CommunicationError, "sparse_allreduce: ", what);
  }
}

// Owner j's status word, as the all-gather brought it; CorruptPayload when
// it is not one that an owner writes.
OwnerStatus checked_status(const TopkCall& c, int j, const OwnerStatus& s) {
  const bool from_owner = s.stage == OwnerStatus::own || s.stage == OwnerStatus::exchange;
  const bool valid = s.reserved == 0 && s.code >= OwnerStatus::ok &&
                     s.code <= OwnerStatus::failed && s.stage >= OwnerStatus::own &&
                     s.stage <= OwnerStatus::payload &&
                     (from_owner ? s.sender == -1 : s.sender >= 0 && s.sender < c.size) &&
                     (s.code != OwnerStatus::ok || (s.stage == OwnerStatus::own && s.sender == -1));
  RELAXCC_ENFORCE(valid, CorruptPayload, "sparse_allreduce: the status of shard ", j,
                  "'s owner reads code ", s.code, ", stage ", s.stage, ", sender ", s.sender,
                  ", reserved ", s.reserved,
                  ", expected code 0 with stage 0 and sender -1, or a code in [1, 4] with a stage "
                  "in [0, 4] and a sender in [-1, ",
                  c.size, ")");
  return s;
}
// The bytes this rank moved: the alltoallv sends each peer its block and
// receives this shard's; the all-gather ring sends every slot but the right
// neighbour's own to the right neighbour and receives every slot but this
// rank's from the left one.
void count_traffic(const TopkCall& c, RelaxedStats& stats) {
  if (c.size == 1) return;
  std::vector<RelaxedStats::Traffic> traffic;
  relaxed::add_owner_schedule_traffic(traffic, c.rank, c.block_bytes, c.slot_bytes, c.direct);
  stats.add_round(traffic);
}

// Direct step 4's input: n copies of this rank's slot, once written.
void copy_own_slot(const TopkCall& c) {
  const int r = c.rank;
  for (int j = 0; j < c.size; ++j)
    c.backend->copy(TopkCall::at(c.spread, j * c.slot_bytes[r]),
                    TopkCall::at(c.gathered, c.slot_offset[r]),
                    static_cast<size_t>(c.slot_bytes[r]), c.ctx);
  c.backend->finish(c.ctx);
}

// Step 4: the owners' slots to every rank, unchanged (after what `options`
// names; direct: after copy_own_slot).
WorkPtr spread_slots(Communicator& comm, const TopkCall& c, const OpOptions& options) {
  return relaxed::spread_owner_slots(comm, c.direct, c.slot(c.rank), c.spread, c.gathered,
                                     c.slot_bytes, c.ctx, options);
}

// Step 5: every owner's status, then (all ok) the residuals committed and
// every shard decoded into x from the same bytes on every rank.
void finish(TopkCall& c) {
  const TensorBackend& backend = *c.backend;
  std::vector<OwnerStatus> statuses(static_cast<size_t>(c.size));
  for (int j = 0; j < c.size; ++j)
    backend.copy(&statuses[static_cast<size_t>(j)], TopkCall::at(c.gathered, c.slot_offset[j]),
                 sizeof(OwnerStatus), c.ctx);
  backend.finish(c.ctx);
  for (int j = 0; j < c.size; ++j) {
    const OwnerStatus s = checked_status(c, j, statuses[static_cast<size_t>(j)]);
    if (s.code != OwnerStatus::ok) throw_owner_failure(c, j, s);
  }
  // Every owner summed every rank's blocks and sent its payload: the call
  // happened, whatever this rank's copy of the all-gather holds.
  c.worker.commit(backend, c.ctx);
  c.server.commit(backend, c.ctx);
  for (int j = 0; j < c.size; ++j)
    if (c.kept[j] > 0) check_header(c, c.payload_gathered(j), j, j, /*gathered=*/true);
  for (int j = 0; j < c.size; ++j) {
    const TensorView shard = c.x.slice(c.shards.offset[j], c.shards.count[j]);
    if (c.kept[j] == 0) {
      backend.fill(shard.data, 0, shard.nbytes(), c.ctx);
      continue;
    }
    try {
      backend.decode(c.payload_gathered(j), shard, /*accumulate=*/false, c.ctx);
    } catch (const CorruptPayload& e) {
      RELAXCC_THROW(CorruptPayload, "sparse_allreduce: ", payload_name(j, j, true), ": ",
                    e.message());
    }
  }
  backend.finish(c.ctx);
}

// Step 5 once the all-gather ended (`gathered`: its failure, if any):
// decided from the gathered status words, the same on every rank; only
// when the all-gather itself failed, from what this rank knows.
void conclude(TopkCall& c, const std::exception_ptr& gathered, RelaxedStats* stats) {
  if (gathered)
    std::rethrow_exception(c.owner_error    ? c.owner_error
                           : c.encode_error ? c.encode_error
                                            : gathered);
  if (stats) count_traffic(c, *stats);
  finish(c);
}

// Top-k on the host: every step submitted now, each to start once the one
// before it completed, the local ones off the engine thread.
WorkPtr top_k(Communicator& comm, const TensorView& x, const ExecContext& ctx,
              const SparseAllreduceOptions& options) {
  const int n = comm.size(), r = comm.rank();
  auto c = std::make_shared<TopkCall>(comm, x, ctx, options, relaxed::tensor_backend(x.device));

  // 1. After options.after: the selection, whose failure travels in the
  // blocks' prefixes (so the alltoallv runs).
  const WorkPtr encoded =
      comm.compute([c] { select_shards(*c); }, op_options(options, options.after));

  // 2. Each shard's block to its owner.
  AlltoallOptions a2a;
  static_cast<OpOptions&>(a2a) = op_options(options, encoded);
  const std::vector<int64_t> recv_counts(static_cast<size_t>(n), c->block_bytes[r]);
  const WorkPtr exchanged =
      comm.alltoallv(c->sent, c->block_bytes, c->received, recv_counts, ctx, a2a);

  // 3. The owner's checks, sum and top-k. It runs whatever the alltoallv
  // ended with: its failure, too, becomes the owner's status word, so the
  // all-gather below runs and every rank learns of it.
  auto settled = std::make_shared<Work>("sparse_allreduce: the alltoallv settled",
                                        exchanged->default_timeout());
  exchanged->then(
      [c, settled](const Work& done) {
        c->exchange_error = done.exception();
        settled->complete(nullptr);
      },
      "sparse_allreduce: the alltoallv's outcome");
  const WorkPtr reduced = comm.compute([c] { reduce_into_slot(*c); }, op_options(options, settled));

  // 4. The owners' slots to every rank, unchanged (direct: once the
  // owner's slot is copied, which runs where the owner's step ran).
  WorkPtr ready = reduced;
  if (c->direct) ready = comm.compute([c] { copy_own_slot(*c); }, op_options(options, reduced));
  const WorkPtr spread = spread_slots(comm, *c, op_options(options, ready));

  // 5.
  RelaxedStats* stats = options.stats;
  return spread->then([c, stats](const Work& done) { conclude(*c, done.exception(), stats); },
                      "sparse_allreduce");
}

// Top-k on device tensors over a communicator that moves device memory
// (NCCL): the host schedule's five steps, stepped on the calling thread,
// with the blocks, this shard's blocks and the owners' slots in payload
// memory from comm.allocate(); the selections (worker and owner) run on
// the device (kernels/cuda/topk.cu), the owner's sum is the device
// decoder's accumulation in rank order, and x is decoded on the device.
// What goes through the host is metadata: every block prefix this owner
// receives and every status word the all-gather brings (16 bytes each),
// each payload header the owner or the decoder checks, the decoders'
// validation flags, and the error-feedback residuals (host memory: copied
// to the device before the selection and back once the call succeeded).
// Results and residuals equal the host schedule's bit for bit; failures
// are decided from the same status words, with the same types.
WorkPtr top_k_device(Communicator& comm, const TensorView& x, const ExecContext& ctx,
                     const SparseAllreduceOptions& options) {
  return on_device(comm, x, options, [&](std::shared_ptr<const TensorBackend> backend) {
    TopkCall c(comm, x, ctx, options, std::move(backend));
    const int n = c.size, r = c.rank;
    // 1. The selection; its failure travels in the prefixes.
    select_shards(c);
    // 2. Each shard's block to its owner.
    AlltoallOptions a2a;
    static_cast<OpOptions&>(a2a) = op_options(options, nullptr);
    const std::vector<int64_t> recv_counts(static_cast<size_t>(n), c.block_bytes[r]);
    try {
      comm.alltoallv(c.sent, c.block_bytes, c.received, recv_counts, ctx, a2a)->wait();
    } catch (...) {
      c.exchange_error = std::current_exception();
    }
    // 3. The owner's checks, sum and top k_r, into its slot.
    reduce_into_slot(c);
    // 4. The owners' slots to every rank, unchanged.
    std::exception_ptr gathered;
    try {
      if (c.direct) copy_own_slot(c);
      spread_slots(comm, c, op_options(options, nullptr))->wait();
    } catch (...) {
      gathered = std::current_exception();
    }
    // 5.
    conclude(c, gathered, options.stats);
  });
}

}  // namespace

int64_t sparse_allreduce_owned(int64_t numel, int rank, int size,
                               const std::vector<double>& shares) {
  RELAXCC_ENFORCE(numel >= 0 && size >= 1 && rank >= 0 && rank < size, InvalidArgument,
                  "sparse_allreduce_owned: ", numel, " elements, rank ", rank, " of ", size);
  return relaxed::Shards(numel, size, shares).count[static_cast<size_t>(rank)];
}

WorkPtr sparse_allreduce(Communicator& comm, const TensorView& x, const ExecContext& ctx,
                         const SparseAllreduceOptions& options) {
  const bool device = x.device.is_cuda() || ctx.device.is_cuda();
  if (device) {
    RELAXCC_ENFORCE(x.device == ctx.device, InvalidArgument, "sparse_allreduce: rank ", comm.rank(),
                    " was given a tensor on ", x.device, " with a context on ", ctx.device,
                    ", expected the same device");
  }
  x.check_valid("sparse_allreduce tensor");
  RELAXCC_ENFORCE(x.dtype == DType::f32, InvalidArgument, "sparse_allreduce: f32 tensors, got ",
                  dtype_name(x.dtype), " on ", x.device);
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
    RELAXCC_ENFORCE(!options.server_feedback, InvalidArgument,
                    "sparse_allreduce: server_feedback is for topk, got randomk");
    RELAXCC_ENFORCE(options.shares.empty(), InvalidArgument,
                    "sparse_allreduce: shares are for topk, got randomk");
    return device ? random_k_device(comm, x, ctx, options) : random_k(comm, x, ctx, options);
  }
  const int64_t owned = sparse_allreduce_owned(x.numel, comm.rank(), comm.size(), options.shares);
  RELAXCC_ENFORCE(!options.server_feedback ||
                      static_cast<int64_t>(options.server_feedback->residual().size()) == owned,
                  InvalidArgument, "sparse_allreduce: server-side error feedback for ",
                  options.server_feedback ? options.server_feedback->residual().size() : 0,
                  " elements, expected the owned shard's ", owned, " (sparse_allreduce_owned)");
  return device ? top_k_device(comm, x, ctx, options) : top_k(comm, x, ctx, options);
}

}  // namespace relaxcc
