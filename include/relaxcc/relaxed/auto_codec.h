// Auto codec: which codec a compressed allreduce of one bucket uses, chosen
// from the measured throughput of the link and of each codec on this CPU (in
// the spirit of Espresso's per-tensor cost model), or the uncompressed
// allreduce when no codec is predicted to be faster.
//
// Calibration (AutoCodec::calibrate, collective over the communicator):
//   - the link: the communicator's own f32 allreduce (the ring, the
//     baseline auto must never lose to), timed at `link_bytes` and at one
//     element; the small one gives the fixed cost of a call, the difference
//     the seconds per byte of the tensor;
//   - each codec of `codecs`: encode and decode of `codec_bytes` of f32
//     with the caller's ExecContext (its thread pool), seconds per f32 byte;
//   - each codec's compressed allreduce (compressed_allreduce.h) at
//     `link_bytes`: what it takes beyond the model's terms below (its
//     buffers, the alltoallv and allgatherv against the ring's pipeline, the
//     owner's step on the engine's thread, memory bandwidth shared with the
//     other ranks of the node), per f32 byte, is the codec's overhead (0 if
//     the terms already account for it all).
// Each number is the median of `repetitions` runs on each rank, but the
// ring's, which is its fastest run; the ring and the codecs' allreduces take
// turns in each repetition, so that both see the same load (a bias towards
// the uncompressed allreduce, against a busy machine's noise). The ranks
// then agree: an allreduce takes the largest of every number over the
// ranks (the slowest rank sets the pace of a collective), so every rank
// holds the same measurements.
//
// Cost model, for a bucket of B f32 bytes over n ranks (predict()):
//   uncompressed  call + B * ring_per_byte
//   codec c       2 call + w_c * B * ring_per_byte
//                 + (n + 1) / n * B * encode_c + 2 B * decode_c + B * overhead_c
// where w_c is the codec's wire bytes over f32 bytes for the bucket's n
// shards (headers and chunk scales counted: the compressed schedule sends
// (n-1)/n of the encoding twice, as the ring sends (n-1)/n of the f32 bytes
// twice), each rank encodes its tensor and the owner its shard, and each
// rank decodes n payloads of its shard and the n owners' payloads. The
// stages run one after the other (no overlap), hence the sum. At the
// calibration size the agreed prediction is at least the time every rank
// measured (a sum of largest terms); the terms carry it to other sizes.
//
// Choice (choose(), a pure function of the agreed measurements, the
// options, n and the bucket's element count, so every rank that runs the
// same build makes the same choice for the same bucket): the codec with the
// smallest predicted time (the first listed among equals), if that time is
// at most `margin` times the uncompressed prediction; otherwise the
// uncompressed allreduce (Communicator::allreduce, not the compressed
// schedule with f32 payloads). The margin absorbs the model's error and
// measurement noise, so that auto is not slower than the ring beyond noise.
// `force` overrides the model (selection as data, e.g. from the
// RELAXCC_AUTO_CODEC tunable): "f32" always takes the uncompressed
// allreduce, a codec name (codec_by_name) always that codec.
//
// Which codecs auto may pick is the error the caller accepts. The default
// is bf16 and minmax 8-bit (chunk 2048, round to nearest): one bf16 rounding
// is within 2^-9 of a value, one 8-bit one within 1/510 of its chunk's
// range; each value meets two (see compressed_allreduce.h), and error
// feedback (CompressedAllreduceState) carries what they drop. Add minmax
// 4-bit (or fewer bits, or sign) for slower links; leave bf16 alone for
// results close to f32; an empty list is always the uncompressed allreduce.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "relaxcc/communicator.h"
#include "relaxcc/kernels/compressor.h"

namespace relaxcc {

// bf16, then minmax 8-bit (chunk 2048, round to nearest).
std::vector<kernels::CompressorConfig> default_auto_codecs();

// "f16", "bf16", "sign", "minmax8", "minmax4", "minmax2", "minmax1" (chunk
// 2048, round to nearest). Throws InvalidArgument naming the valid names.
kernels::CompressorConfig codec_by_name(const std::string& name);
// The name of a dense codec as codec_by_name reads it ("minmax8"); other
// chunks and stochastic rounding are appended ("minmax4/chunk256/stochastic").
std::string codec_name(const kernels::CompressorConfig& codec);

// What calibration measures; on one rank, or agreed (the largest over the
// ranks).
struct AutoCodecMeasurements {
  double call_seconds = 0;           // an allreduce of one f32 element
  double ring_seconds_per_byte = 0;  // allreduce time per f32 byte beyond call_seconds
  // Per entry of AutoCodecOptions::codecs: seconds per f32 byte of encoding
  // and decoding, and of the schedule's overhead (see above).
  std::vector<double> encode_seconds_per_byte, decode_seconds_per_byte, overhead_seconds_per_byte;
};

struct AutoCodecOptions {
  // The codecs auto may pick besides the uncompressed allreduce: dense kinds
  // (f16, bf16, minmax, sign).
  std::vector<kernels::CompressorConfig> codecs = default_auto_codecs();
  // A codec is chosen only if its predicted time is at most `margin` times
  // the uncompressed allreduce's; in (0, 1].
  double margin = 0.8;
  // "auto" (the cost model), "f32" (always the uncompressed allreduce), or a
  // codec name (codec_by_name; any dense codec, listed in `codecs` or not).
  std::string force = "auto";
  // Calibration: bytes of the timed allreduces (the ring's and each codec's
  // compressed one) and of the codecs' timed encode and decode, and runs of
  // each (the median counts).
  int64_t link_bytes = int64_t{32} << 20;
  int64_t codec_bytes = int64_t{16} << 20;
  int repetitions = 3;
  // When set, this rank's measurements instead of measuring (tests; a replay
  // of an earlier calibration); they are still agreed over the ranks. Set on
  // every rank or on none (measuring is collective). One encode, decode and
  // overhead figure per entry of `codecs`.
  std::optional<AutoCodecMeasurements> measured;
};

// One choice: the uncompressed allreduce (codec unset), or a codec.
struct AutoChoice {
  std::optional<kernels::CompressorConfig> codec;
  int index = -1;                // in AutoCodecOptions::codecs; -1: uncompressed or forced
  double predicted_seconds = 0;  // of the choice (0 when forced)
  double uncompressed_seconds = 0;
};

// Agreed measurements and options of one communicator: immutable after
// calibrate(), so one AutoCodec serves any number of concurrent calls
// (CompressedAllreduceOptions::auto_codec).
class AutoCodec {
 public:
  // Collective over `comm`: every rank calls it with the same options
  // (codecs, margin, force; PeerMismatch on every rank otherwise). Measures
  // (unless options.measured) and agrees. InvalidArgument for options out of
  // range, a sparse codec, a `force` that is no codec name, or measured
  // figures that are negative or not one per codec.
  // Calibration measures and agrees in host memory: a context on a device
  // is Unsupported. For device tensors (an NCCL communicator), build the
  // AutoCodec from measurements with the constructor below; its choices
  // serve compressed_allreduce on device tensors like host ones.
  static AutoCodec calibrate(Communicator& comm, const ExecContext& ctx,
                             AutoCodecOptions options = {});
  // From measurements already agreed over `ranks` ranks; no communication.
  // Same checks as calibrate().
  AutoCodec(int ranks, AutoCodecMeasurements agreed, AutoCodecOptions options = {});

  int ranks() const noexcept { return ranks_; }
  const AutoCodecMeasurements& measurements() const noexcept { return agreed_; }
  const AutoCodecOptions& options() const noexcept { return options_; }

  // Predicted seconds of an allreduce of `numel` f32 elements: uncompressed
  // (index -1) or with codec `index` of options().codecs.
  double predict(int64_t numel, int index) const;
  // The choice for a bucket of `numel` f32 elements (see above).
  AutoChoice choose(int64_t numel) const;

 private:
  int ranks_;
  AutoCodecMeasurements agreed_;
  AutoCodecOptions options_;
  std::optional<kernels::CompressorConfig> forced_;
  bool forced_f32_ = false;
};

}  // namespace relaxcc
