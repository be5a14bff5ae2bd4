// Sparse allreduce (issue [F] item 5): x becomes the sum (or average) over
// the ranks of a sparse selection of every rank's x, at full precision, with
// 0 at the coordinates nobody kept. The codec's kind picks the selection.
//
// Random-k (kind randomk): every rank keeps the same k coordinates of its
// tensor, drawn from a shared (seed, step) by relaxcc/kernels/compressor.h's
// randomk (stratified, or CocktailSGD's rolling stride), and the ranks
// allreduce those k values only. No index travels, and the bytes per rank
// are the ring's for k values. Ranks that disagree on the selection (seed,
// step, ratio, keep or mode) would sum unrelated coordinates: a 16-byte
// allreduce of the selection's hash goes with the values, and every rank
// throws PeerMismatch, leaving x untouched, when the hashes differ.
//
// Top-k (kind topk): a sparse reduce-scatter to shard owners, then an
// all-gather of each owner's top-k. For n ranks, rank r owns shard r of n
// balanced shards of x. The tensor's budget k = kept_elements(x.numel,
// codec) (ceil(ratio * numel), or `keep`) is split the same way, k_j =
// balanced share j of k (k_j <= the shard's size), so the k kept coordinates
// are the top k_j of each shard rather than the top k of the whole tensor:
//   1. every rank selects the k_j largest |x| of each shard j (kernels'
//      topk, exact or approximate as the codec says; worker-side error
//      feedback: the residual is added first and keeps what was not sent);
//   2. an alltoallv sends shard j's k_j (index, value) pairs to owner j;
//   3. owner r sums the n payloads of its shard in f32 (rank order; avg:
//      then divides by n), keeps their top k_r (server-side error feedback:
//      what it drops waits in server_feedback) and encodes them once;
//   4. an allgatherv forwards the owners' payloads unchanged;
//   5. every rank writes every shard's pairs into x, 0 elsewhere, from the
//      same bytes: the results are bitwise identical on every rank.
// Bytes sent per rank: (n-1)/n of the k pairs (8 bytes each) in the
// alltoallv and again in the all-gather, ~ 16 k (n-1)/n, plus 104 bytes of
// headers per peer: the traffic does not grow with the number of ranks (an
// all-gather of every rank's top-k, as DeMo's, grows as n k). Exact where
// nothing is dropped: when every rank's nonzeros in shard j, and their union,
// number at most k_j, x holds the exact f32 sum of the inputs.
//
// Failures of the owner's step (a payload that does not decode, a header of
// another kind, element count or k, ranks that disagree on the layout, a sum
// that overflows f32) travel with the all-gather as a status word per owner:
// every rank throws the same type (CorruptPayload, PeerMismatch,
// InvalidArgument; CommunicationError for anything else), naming the owner
// and the sender, and leaves x untouched; the owner throws its own error.
// Decoders never trust the wire: every index must lie in the shard and
// strictly increase, every value must be finite, and every count must match
// the layout. A payload corrupted in the all-gather itself fails only the
// rank that receives it (CorruptPayload; x may then hold the shards decoded
// before it).
//
// Both kinds encode inside a Work (after options.after, if any): an input
// the codec refuses (NaN, Inf) fails this rank's collectives, and so every
// rank, instead of leaving the peers waiting. No thread of their own: the
// owner's step runs where the alltoallv completes (the engine's thread or a
// thread waiting on a Work).
#pragma once

#include "relaxcc/communicator.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/kernels/error_feedback.h"
#include "relaxcc/relaxed/relaxed_stats.h"

namespace relaxcc {

struct SparseAllreduceOptions : OpOptions {
  // randomk or topk, ratio in (0, 1] (or keep > 0). randomk: seed and step
  // shared by every rank (the step rolls the selection from call to call).
  // topk: `approximate` picks the sampled-threshold selection.
  kernels::CompressorConfig codec = [] {
    kernels::CompressorConfig c;
    c.kind = kernels::CompressorKind::randomk;
    return c;
  }();
  ReduceOp op = ReduceOp::sum;  // sum or avg
  // Set: worker-side error feedback, made for x's element count; it must
  // outlive the call's Work.
  kernels::ErrorFeedback* feedback = nullptr;
  // topk only. Set: server-side error feedback of the owned shard, made for
  // sparse_allreduce_owned(x.numel, comm.rank(), comm.size()) elements (in
  // the units of `op`: keep the op from call to call); it must outlive the
  // call's Work.
  kernels::ErrorFeedback* server_feedback = nullptr;
  // topk only: bytes sent to and received from each peer, one round per call.
  RelaxedStats* stats = nullptr;
};

// InvalidArgument, from the call on every rank before anything is
// submitted, for a tensor that is not f32 on the host, a codec other than
// randomk and topk or out of its ranges (ratio outside (0, 1]), an op other
// than sum and avg, feedback of another size, or server_feedback or stats
// with randomk.
WorkPtr sparse_allreduce(Communicator& comm, const TensorView& x, const ExecContext& ctx,
                         const SparseAllreduceOptions& options = {});

// The elements of the shard that `rank` of `size` owns in a top-k sparse
// allreduce of `numel` elements (the size of its server_feedback).
int64_t sparse_allreduce_owned(int64_t numel, int rank, int size);

}  // namespace relaxcc
