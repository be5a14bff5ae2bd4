// BucketFeedback: the error feedback of a compressed allreduce per gradient
// bucket (relaxcc/relaxed/compressed_allreduce.h), for the algorithms that
// compress buckets (bytegrad, qadam).
//
// A state belongs to a bucket's layout. When the plan changes (the Reducer's
// rebuild after the first step, the bucket tuner), a bucket whose layout is
// unchanged keeps its state as it is; otherwise its residuals carry over by
// flat offset (AlgorithmContext::flat_offset): the worker residual of each
// tensor moves to the tensor's new place, and the server residual of the
// owned shard is folded into this rank's worker residual of the same
// elements (times `fold_scale`: the number of ranks for an averaging
// allreduce, whose server residual is in units of the average), so that the
// next allreduce delivers it. Padding between tensors carries nothing.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "relaxcc/algorithm.h"
#include "relaxcc/relaxed/compressed_allreduce.h"

namespace relaxcc::algorithms {

class BucketFeedback {
 public:
  // One state per f32 bucket of ctx.plan, made for a communicator where this
  // rank is `rank` of `size` (the inter-node communicator of a hierarchical
  // allreduce on leaders). Residuals of the previous plan carry over (see
  // above).
  void rebind(const AlgorithmContext& ctx, int rank, int size, float fold_scale);
  // The state of bucket `bucket` of the plan last bound.
  CompressedAllreduceState* state(int bucket) const;
  bool empty() const { return slots_.empty(); }

  // Entries "<prefix>bucket<b>/worker", "<prefix>bucket<b>/server" and
  // "<prefix>bucket<b>/layout" (the bucket's first flat offset and size,
  // checked on load). load() throws InvalidArgument when the saved buckets
  // differ from the bound plan's (a checkpoint of another plan).
  void save(StateDict& dict, const std::string& prefix) const;
  void load(const StateDict& dict, const std::string& prefix);

 private:
  struct Slot {
    std::vector<BucketEntry> entries;
    int64_t numel = 0;
    int64_t shard_begin = 0;  // the owned shard, in bucket elements
    std::unique_ptr<CompressedAllreduceState> state;
  };
  // The flat offset of a bucket's first tensor, or -1 for an empty bucket.
  int64_t first_flat(const Slot& slot) const;

  std::vector<Slot> slots_;
  std::vector<int64_t> flat_offset_;
  int rank_ = 0, size_ = 1;
};

}  // namespace relaxcc::algorithms
