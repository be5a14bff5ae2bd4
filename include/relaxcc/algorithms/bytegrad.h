// bytegrad: every bucket of gradients goes through the compressed allreduce
// (relaxcc/relaxed/compressed_allreduce.h) with the min-max codec, 8 bits by
// default: each value is quantized once by its sender and once by its
// shard's owner, and every rank ends with the same bits. Bagua's ByteGrad
// (BaguaSys/bagua, bagua/torch_api/algorithms/bytegrad.py) is the model:
// MinMaxUInt8, round to nearest, hierarchical, no error feedback.
//
// hierarchical: with two nodes or more, full precision within each node,
// compressed across node leaders, broadcast within the node (the node
// layout from build_hierarchy, so RELAXCC_RANKS_PER_NODE emulates nodes on
// one machine). On one node the flat compressed allreduce runs instead
// (every rank quantizes), so the defaults compress on one machine too: the
// hierarchy would quantize nothing there (an exact intra-node reduce and an
// inter-node step of one member).
// error_feedback: worker- and server-side residuals per bucket
// (BucketFeedback), saved in state_dict.
#pragma once

#include "relaxcc/algorithm.h"
#include "relaxcc/algorithms/bucket_feedback.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/topology.h"

namespace relaxcc::algorithms {

struct ByteGradOptions {
  // Bits per value: 8, 4, 2 or 1 (Bagua: 8, MinMaxUInt8).
  int bits = 8;
  // Elements per min-max chunk (one f32 min and scale each). Bagua takes
  // one chunk per rank's share of a bucket; 2048 is relaxcc's codec default.
  int64_t chunk = 2048;
  // Bagua rounds to nearest (rint).
  kernels::Rounding rounding = kernels::Rounding::nearest;
  // Bagua: hierarchical=True. Takes effect with two nodes or more (above).
  bool hierarchical = true;
  // Bagua has none.
  bool error_feedback = false;
  // Average over ranks (else sum).
  bool average = true;
};

class ByteGrad final : public Algorithm {
 public:
  // Throws InvalidArgument for bits outside 1..8 or not 8, 4, 2, 1, or a
  // chunk < 1.
  explicit ByteGrad(ByteGradOptions options = {});
  std::string name() const override { return "bytegrad"; }
  AlgorithmCapabilities capabilities() const override;
  void init(const AlgorithmContext& ctx) override;
  WorkPtr on_bucket_ready(const StepInfo& step, int bucket, const TensorView& data) override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state) override;

 private:
  ByteGradOptions options_;
  AlgorithmContext ctx_;
  HierarchicalComms hierarchy_;
  bool have_hierarchy_ = false;
  bool use_hierarchy_ = false;  // hierarchical, over two nodes or more
  BucketFeedback feedback_;
};

}  // namespace relaxcc::algorithms
