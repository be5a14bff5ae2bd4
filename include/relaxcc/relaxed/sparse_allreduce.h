// Sparse allreduce: x becomes the sum (or average) over
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
// codec) (ceil(ratio * numel), or `keep`) is split into shares k_j <= the
// shard's size that sum to k: k_j = floor(k / n), plus 1 for k mod n of
// the m shards with room for it (all n, or the first numel mod n when
// floor(k / n) already fills the smaller ones): shard j < m takes it when
// (j - codec.step) mod m < k mod n. The step rotates the extra share, so
// with k < n the shards take turns: pass the training step, as random-k
// does (a step that never changes leaves the shards without a share unsent,
// their residual growing). The k kept coordinates are the top k_j of each
// shard rather than the top k of the whole tensor:
//   1. every rank selects the k_j largest |x| of each shard j (kernels'
//      topk, exact or approximate as the codec says; worker-side error
//      feedback: the residual is added first and keeps what was not sent);
//   2. an alltoallv sends owner j a block: a 16-byte prefix (a fingerprint
//      of the call: element count, k, op, ratio, keep, step, exact or
//      approximate; and whether the sender's selection succeeded), then
//      shard j's k_j (index, value) pairs, shard-relative;
//   3. owner r checks every sender's prefix, sums the n payloads of its
//      shard in f32 (rank order; avg: then divides by n), keeps their top
//      k_r (server-side error feedback: what it drops waits in
//      server_feedback) and encodes them once;
//   4. an allgatherv forwards the owners' slots unchanged: a 16-byte status
//      word, then the payload (with unequal shares, an alltoallv sends each
//      owner's slot straight to every rank);
//   5. every rank writes every shard's pairs into x, 0 elsewhere, from the
//      same bytes: the results are bitwise identical on every rank.
// Steps 1 and 3 run off the engine thread (Communicator::compute) on host
// tensors; on device tensors see below.
// Bytes sent per rank: (n-1)/n of the k pairs (8 bytes each) in the
// alltoallv and again in the all-gather, ~ 16 k (n-1)/n, plus per peer the
// blocks' prefixes and payload headers and the owners' status words (about
// 130 bytes) and the transport's own headers: the traffic does not grow
// with the number of ranks (an all-gather of every rank's top-k, as
// DeMo's, grows as n k). Exact where nothing is dropped: when, for every
// shard j, every rank's nonzeros of its input plus its residual, and their
// union, number at most k_j (and the server residual is 0 there), x holds
// the exact f32 sum.
//
// Failures. Every owner's status word travels with the all-gather, and
// every rank decides from the gathered words: the first owner in rank order
// whose status is not ok decides, the same type on every rank (the owner's
// and the sender's included), naming the owner and the rank at fault, with
// this rank's own error message appended where it is the source:
//   - PeerMismatch: a sender's fingerprint differs from the owner's (ranks
//     that disagree on the element count, k, op, ratio, keep, step or
//     selection), or the alltoallv's blocks disagree in size;
//   - InvalidArgument: a rank's input that its selection refused (NaN, Inf,
//     or x plus its residual overflowing f32), or an owner's sum (plus its
//     server residual) that overflows f32;
//   - CorruptPayload: a payload that does not decode: decoders never trust
//     the wire (a prefix or status word out of range, a header of another
//     kind, element count or k, an index outside the shard or out of order,
//     a value that is not finite);
//   - CommunicationError: anything else (the alltoallv failed on an owner).
// x and both error feedbacks are then untouched on every rank: the new
// residuals are computed into buffers of the call's own and put in place
// only once every status word is ok. When the all-gather itself fails,
// each rank throws its own error from steps 1-3 if it has one, otherwise
// the all-gather's. A payload corrupted in the all-gather (after every
// status word said ok) fails the ranks that receive it with CorruptPayload:
// every slot's header is checked before x is written, but an index or
// value found corrupt while decoding may leave x holding the shards decoded
// before it; the residuals are committed, since every owner's step
// succeeded (unless the corrupt bytes are a status word, which fails the
// rank before it commits).
//
// Both kinds encode inside a Work (after options.after, if any): an input
// the codec refuses fails this rank's collectives (random-k) or travels in
// its blocks' prefixes (top-k), and so every rank fails instead of leaving
// the peers waiting. A random-k call, too, changes its error feedback only
// when it succeeds. No thread of their own.
#pragma once

#include <vector>

#include "relaxcc/communicator.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/kernels/error_feedback.h"
#include "relaxcc/relaxed/relaxed_stats.h"

namespace relaxcc {

struct SparseAllreduceOptions : OpOptions {
  // randomk or topk, ratio in (0, 1] (or keep > 0). randomk: seed and step
  // shared by every rank (the step rolls the selection from call to call).
  // topk: `approximate` picks the sampled-threshold selection; the step,
  // shared by every rank, rotates the shares of k over the shards.
  kernels::CompressorConfig codec = [] {
    kernels::CompressorConfig c;
    c.kind = kernels::CompressorKind::randomk;
    return c;
  }();
  ReduceOp op = ReduceOp::sum;  // sum or avg
  // Set: worker-side error feedback, made for x's element count; it must
  // outlive the call's Work. A call reads the residual when it encodes and
  // replaces it when it completes successfully: calls that share it must
  // run one after the other (the next one `after` this one).
  kernels::ErrorFeedback* feedback = nullptr;
  // topk only. Set: server-side error feedback of the owned shard, made for
  // sparse_allreduce_owned(x.numel, comm.rank(), comm.size(), shares) elements (in
  // the units of `op`: keep the op from call to call); it must outlive the
  // call's Work. Changed, as `feedback`, only by a call that succeeds.
  kernels::ErrorFeedback* server_feedback = nullptr;
  // Bytes sent to and received from each peer (topk: the blocks and slots;
  // randomk: its two allreduces, which then run on the ring; not the
  // transport's own headers), one round per collective that completed; it
  // must outlive the call's Work.
  RelaxedStats* stats = nullptr;
  // topk only: rank j owns shard j of this split (relaxcc/collectives/shares.h;
  // owner_shares gives them from link rates), and k is split in proportion;
  // empty: equal shards. Not empty: step 4 sends each owner's slot straight
  // to every rank (an alltoallv) instead of around the ring. Every rank
  // passes the same shares: the layout is in the blocks' fingerprint, so a
  // rank whose split differs gives PeerMismatch.
  std::vector<double> shares;
};

// Device tensors. A CUDA tensor with a context on its device runs over a
// communicator that moves that device's memory (NCCL; Unsupported naming
// the call, the rank and the device otherwise, before anything is read).
// Both kinds are stepped on the calling thread (after options.after) and
// return a completed Work; each wait is bounded by the communicator's
// timeout. Results and residuals equal the host path's bit for bit where
// the sum is exact (top-k: always, the owners' sums being added in the same
// order). x and the residuals are untouched unless the call succeeds.
//
// Random-k: the device gathers the k values into payload memory from
// comm.allocate() (CUDA randomk encode; with error feedback, the residual
// is added and updated on the device), the communicator allreduces them, a
// second allreduce of three integers checks the selection and whether some
// rank's encode failed, and the device scatters the sum into x. A rank whose
// encode fails throws its own error, its peers CommunicationError naming
// it; on a selection mismatch every rank throws PeerMismatch.
//
// Top-k: the five steps above, with the blocks, the owned shard's blocks and
// the owners' slots in payload memory from comm.allocate(), the alltoallv
// and all-gather on the communicator, and every selection (the ranks' and
// the owners') on the device (kernels/cuda/topk.cu: an exact radix select
// with the host selection's tie rule); the owner sums the payloads with
// the device decoder, in rank order. Failures are decided as on the host,
// with the same types. What goes through the host is metadata only: each
// block prefix the owner receives and each status word the all-gather
// brings (16 bytes each), the payload headers that the owner and the
// decoders check, and the kernels' validation flags.
//
// Tensor data never goes through the host; the residuals of `feedback` and
// `server_feedback` (host memory) are copied to the device before the
// encode and back once the call succeeded. A context on another device
// than x is InvalidArgument. InvalidArgument, from the call on every rank
// before anything is submitted, for a tensor that is not f32, a codec
// other than randomk and topk or out of its ranges (ratio outside (0, 1]),
// an op other than sum and avg, feedback of another size, or
// server_feedback with randomk.
WorkPtr sparse_allreduce(Communicator& comm, const TensorView& x, const ExecContext& ctx,
                         const SparseAllreduceOptions& options = {});

// The elements of the shard that `rank` of `size` owns in a top-k sparse
// allreduce of `numel` elements (the size of its server_feedback).
int64_t sparse_allreduce_owned(int64_t numel, int rank, int size,
                               const std::vector<double>& shares = {});

}  // namespace relaxcc
