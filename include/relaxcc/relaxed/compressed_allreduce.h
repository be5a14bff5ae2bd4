// Compressed allreduce: each value is quantized at most twice, whatever the
// number of ranks, and every rank ends with bitwise identical results.
//
// Schedule, for n ranks, rank r owning shard r of n balanced shards of x,
// each shard cut into pieces of about segment_bytes / n (segment s: piece s
// of every shard; pieces of at least 16384 elements and whole codec chunks,
// at most 64 segments per call, one with centered clipping), per segment:
//   1. every rank encodes each shard's piece (worker-side error feedback:
//      the piece's residual is added first and what the payload misses is
//      kept);
//   2. an alltoallv sends piece j's payload straight to its owner j;
//   3. owner r decodes the n payloads of its piece and sums them in f32
//      (avg: then divides by n), and encodes the result once (server-side
//      error feedback on its shard);
//   4. an allgatherv forwards the owners' payloads unchanged (with unequal
//      shares, an alltoallv sends each owner's payload straight to every
//      rank);
// and once every segment arrived:
//   5. every rank decodes every payload into x (the owner its own payload
//      too, so all ranks hold the same bits).
// Steps 1, 3 and 5 run off the thread that moves the data
// (Communicator::compute), so the encoding of segment s + 1 and the owner's
// reduction of segment s - 1 overlap the transfer of segment s. Every stage
// is submitted at the call, in the same order on every rank.
// An int8 ring that re-quantizes at every hop (PCCL, prime-diloco) adds one
// quantization error per hop; here a value meets one worker-side and one
// server-side quantization. Bytes sent per rank: (n-1)/n of x's encoding,
// twice (the same as the f32 ring with encoded elements).
//
// Codecs: the dense kinds of relaxcc/kernels/compressor.h (f16, bf16, minmax
// with 8, 4, 2 or 1 bits, sign), nearest or stochastic rounding; or none: f32
// on the wire (full precision, for robust aggregation without compression).
//
// Robust aggregation. The owner sees every rank's contribution to its shard
// apart, so it can aggregate them robustly instead of averaging (as BTARD
// runs CenteredClip on each all-reduce shard); the result is then a robust
// average (op must be avg):
//   trimmed_mean   per coordinate, the mean of the n values without the
//                  `trim` smallest and `trim` largest (2 trim < n). With b <=
//                  trim ranks sending anything, every coordinate stays
//                  within the range of the honest ranks' values.
//   centered_clip  v = the coordinate-wise median, then `iterations` times
//                  v += (1/n) sum_i (x_i - v) min(1, tau / ||x_i - v||)
//                  (L2 norms over the shard). Each iteration moves v by at
//                  most tau * b / n towards b bad ranks' values.
// A contribution sent as f32 must be finite (CorruptPayload otherwise). Stochastic
// rounding draws from Philox at ctx.rng: worker-side encodes of rank r use
// seed ctx.rng.seed + 1 + r, server-side encodes seed ctx.rng.seed, each at
// counter ctx.rng.offset + the piece's first element (relaxcc/kernels/philox.h).
//
// Agreement. The payloads' headers carry the codec (kind, bits, chunk,
// rounding) and, with stochastic rounding, the call's RNG position (ctx.rng
// seed and offset); a rank that gets a payload of another codec or RNG
// position throws PeerMismatch naming the sender, and its allgather fails,
// so every rank fails. A payload that does not decode throws CorruptPayload
// the same way. A size that differs across ranks fails the alltoallv with
// PeerMismatch.
//
// With OpOptions::after, the call takes its place in the communicator's
// order at once and encodes x (step 1) once that Work completed. x and the
// error-feedback state are written only at the end of step 5, once every
// payload decoded: when any stage fails, both are left as they were. Calls
// that share a state must therefore run one after the other (the next one
// `after` this one).
//
// Auto codec (relaxcc/relaxed/auto_codec.h): with options.auto_codec set,
// `codec` is ignored and each call takes auto_codec->choose(x.numel): a
// codec for this schedule, or the uncompressed allreduce
// (Communicator::allreduce with op sum or avg, its selection table and its
// ring), which auto takes whenever no codec is predicted faster by the
// AutoCodec's margin (with shares: this schedule with f32 payloads). Every rank makes the same
// choice (agreed calibration, same bucket size). With robust aggregation the uncompressed choice is
// this schedule with f32 payloads (the allreduce cannot aggregate robustly). The uncompressed
// allreduce leaves an error-feedback state as it is (its residuals wait for the next compressed
// call; a bucket's choice only changes with a new calibration).
//
// Hierarchical variant: full precision within each node (an allreduce over
// the node's ranks, shared memory on one machine), compressed across nodes
// (this schedule over the node leaders), then a broadcast within each node.
// Every call is submitted at once, each stage after the previous one, so
// concurrent calls keep their order on every communicator. Its first stage
// writes the node's sum into x: a later failure leaves that sum there.
//
// Device tensors. x on a CUDA device (ctx.device the same, ctx.stream a
// cudaStream_t of it) runs the same schedule with the CUDA kernels
// (kernels/cuda/cuda_kernels.h): encodes, decodes, sums and error feedback
// on the device, residuals in the state's device memory, payload buffers
// from comm.allocate(), and every transfer through `comm` on device memory
// (an NCCL communicator: nothing is copied through the host). Payloads,
// results and residuals equal the host path's bit for bit on the same
// data; validation, errors and RelaxedStats counts are the host path's. The
// CUDA decoder validates on the device and reads its flags back, so the
// stages are stepped on the calling thread: the call returns once x holds
// the result (or the error is known) and its Work has completed; segment s
// is still on the wire while segment s + 1 is encoded. Since it waits, a
// device call must not be made from a completion callback (work.h). A rank whose own
// stage fails still takes part in every later transfer, sending payloads
// that decode as corrupt (all bytes 0xff), so that its peers fail with
// CorruptPayload instead of waiting for it; it fails with its own error. options.after is waited
// for (with its communicator's timeout) before the first stage. A communicator whose allocate()
// gives memory of another device (an MPI communicator) is Unsupported, at the call, before anything
// is read; so are robust aggregation (its sorting runs on the host) and the sign codec (no CUDA
// kernel) on a device. The hierarchical variant and the auto codec's choices take device tensors
// the same way (the uncompressed choice is the communicator's allreduce on device memory);
// AutoCodec::calibrate runs on the host.
//
// Which relaxed primitives take device tensors: compressed_allreduce,
// hierarchical_compressed_allreduce and the auto codec's choices. Gossip,
// CHOCO gossip, group averaging (Moshpit), asynchronous model averaging and
// the sparse allreduce (top-k, random-k) take host tensors only and throw
// Unsupported, naming themselves, the rank and the device, at their entry
// point, before touching memory.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "relaxcc/communicator.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/relaxed/auto_codec.h"
#include "relaxcc/relaxed/relaxed_stats.h"
#include "relaxcc/state_dict.h"
#include "relaxcc/topology.h"

namespace relaxcc {

namespace relaxed {
struct StateAccess;
}  // namespace relaxed

// Error feedback of a compressed allreduce of one tensor on one
// communicator: a residual per shard on the worker side, and the owned
// shard's residual on the server side, on the tensor's device. Saved and
// restored bit for bit.
class CompressedAllreduceState {
 public:
  // For a tensor of `numel` elements on a communicator of `size` ranks, this
  // rank being `rank`, with its residuals on `device` (the tensor's: a CUDA
  // device keeps them in device memory; Unsupported in a build without
  // CUDA).
  // `shares`: the calls' CompressedAllreduceOptions::shares (the owned
  // shard's size follows from them).
  CompressedAllreduceState(int64_t numel, int rank, int size, Device device = Device::host(),
                           const std::vector<double>& shares = {});

  int64_t numel() const noexcept { return numel_; }
  Device device() const noexcept { return device_; }
  // A host state's worker-side residual of x (numel elements) and
  // server-side residual of the owned shard. A device state keeps them on its
  // device and leaves these empty (save() reads them).
  std::vector<float>& worker() noexcept { return worker_; }
  std::vector<float>& server() noexcept { return server_; }
  const std::vector<float>& worker() const noexcept { return worker_; }
  const std::vector<float>& server() const noexcept { return server_; }

  // Entries "<prefix>worker" and "<prefix>server" (a device state copies
  // them through the host). load() throws InvalidArgument for missing
  // entries or sizes that do not match.
  void save(StateDict& dict, const std::string& prefix) const;
  void load(const StateDict& dict, const std::string& prefix);

 private:
  friend struct relaxed::StateAccess;
  int64_t numel_;
  int64_t owned_;  // server-side residual elements
  Device device_;
  std::vector<float> worker_, server_;        // host state
  TensorView worker_device_, server_device_;  // device state (owning their memory)
};

struct RobustAggregation {
  enum class Kind { none, trimmed_mean, centered_clip };
  Kind kind = Kind::none;
  int trim = 1;        // trimmed_mean: dropped at each end, 2 trim < ranks
  double tau = 1.0;    // centered_clip: clipping radius, > 0
  int iterations = 3;  // centered_clip: >= 1
};

struct CompressedAllreduceOptions : OpOptions {
  // A dense kind; unset: f32 on the wire.
  std::optional<kernels::CompressorConfig> codec = kernels::CompressorConfig{};
  ReduceOp op = ReduceOp::sum;  // sum or avg (avg only, with robust aggregation)
  RobustAggregation robust;
  // Error feedback (worker and server side) when set; it must have been made
  // for this tensor's size and this communicator, and outlive the Work.
  CompressedAllreduceState* state = nullptr;
  RelaxedStats* stats = nullptr;  // bytes sent and received per peer
  // f32 bytes of x per pipeline segment (each shard contributes a piece of
  // segment_bytes / ranks); every rank must pass the same.
  int64_t segment_bytes = int64_t{1} << 20;
  // When set, chooses the codec of each call (see "Auto codec" above) and
  // `codec` is ignored. Calibrated on this communicator (hierarchical: on
  // comms.inter; ignored elsewhere); it must outlive the call.
  const AutoCodec* auto_codec = nullptr;
  // Rank j owns shard j of this split (relaxcc/collectives/shares.h;
  // owner_shares gives them from link rates); empty: equal shards. Not
  // empty: step 4 sends each owner's payload straight to every rank (an
  // alltoallv) instead of around the ring, so that a rank that owns little
  // also forwards little. Every rank passes the same shares: the shard
  // counts travel in the header of every collective of the call
  // (OpOptions::agree), so ranks whose counts differ, by one element even
  // where the payloads' sizes match, fail with PeerMismatch on every rank,
  // naming the shard counts, before anything is decoded.
  std::vector<double> shares;
};

// x (f32) becomes the (compressed) sum or average over the ranks, in place
// (on one rank it stays as it is: nothing is quantized). InvalidArgument for
// another dtype, a context on another device than x, a sparse codec, an op
// other than sum and avg (avg with robust aggregation), robust options out
// of range, a state of another size or device, or an auto codec calibrated
// for another rank count. Device tensors: see "Device tensors" above.
WorkPtr compressed_allreduce(Communicator& comm, const TensorView& x, const ExecContext& ctx,
                             const CompressedAllreduceOptions& options = {});

// The hierarchical variant over build_hierarchy(comm)'s communicators; every
// rank of `comm` calls it. The state, if any, is the leaders' (made for the
// inter-node communicator; ignored elsewhere). InvalidArgument with robust
// aggregation (the leaders see node sums, not ranks).
WorkPtr hierarchical_compressed_allreduce(Communicator& comm, const HierarchicalComms& comms,
                                          const TensorView& x, const ExecContext& ctx,
                                          const CompressedAllreduceOptions& options = {});

}  // namespace relaxcc
