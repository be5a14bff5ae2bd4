#include "relaxcc/algorithms/bucket_feedback.h"

#include <map>

#include "relaxcc/errors.h"

namespace relaxcc::algorithms {
namespace {

bool same_layout(const std::vector<BucketEntry>& a, const std::vector<BucketEntry>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].tensor != b[i].tensor || a[i].offset != b[i].offset || a[i].numel != b[i].numel)
      return false;
  return true;
}

// The first element of shard `rank` of `size` balanced shards of `numel`
// elements, checked against the size the state gives the owned shard.
int64_t shard_begin(int64_t numel, int rank, int size, const CompressedAllreduceState& state) {
  const int64_t base = numel / size, extra = numel % size;
  const int64_t count = base + (rank < extra ? 1 : 0);
  RELAXCC_ENFORCE_EQ(static_cast<int64_t>(state.server().size()), count, InternalError,
                     "BucketFeedback: owned shard of ", numel, " elements, rank ", rank, " of ",
                     size);
  return rank * base + std::min<int64_t>(rank, extra);
}

}  // namespace

int64_t BucketFeedback::first_flat(const Slot& slot) const {
  return slot.entries.empty() ? -1 : flat_offset_[slot.entries.front().tensor];
}

void BucketFeedback::rebind(const AlgorithmContext& ctx, int rank, int size, float fold_scale) {
  // Residuals of buckets whose layout changed, by flat offset.
  std::map<int64_t, float> carried;
  std::vector<Slot> old = std::move(slots_);
  slots_.clear();
  const auto& buckets = ctx.plan->buckets();
  std::vector<char> reused(old.size(), 0);
  for (const Bucket& b : buckets) {
    Slot slot;
    slot.entries = b.entries;
    slot.numel = b.dtype == DType::f32 ? b.numel : 0;
    for (size_t o = 0; o < old.size(); ++o) {
      if (reused[o] || !old[o].state || old[o].numel != slot.numel || rank != rank_ ||
          size != size_ || !same_layout(old[o].entries, slot.entries))
        continue;
      slot.state = std::move(old[o].state);
      slot.shard_begin = old[o].shard_begin;
      reused[o] = 1;
      break;
    }
    slots_.push_back(std::move(slot));
  }
  for (size_t o = 0; o < old.size(); ++o) {
    if (reused[o] || !old[o].state) continue;
    const Slot& s = old[o];
    std::vector<float> worker = s.state->worker();
    const std::vector<float>& server = s.state->server();
    for (size_t j = 0; j < server.size(); ++j)
      worker[static_cast<size_t>(s.shard_begin) + j] += fold_scale * server[j];
    for (const BucketEntry& e : s.entries)
      for (int64_t j = 0; j < e.numel; ++j)
        carried[flat_offset_[e.tensor] + j] = worker[static_cast<size_t>(e.offset + j)];
  }
  flat_offset_ = ctx.flat_offset;
  rank_ = rank;
  size_ = size;
  for (Slot& slot : slots_) {
    if (slot.state) continue;
    slot.state = std::make_unique<CompressedAllreduceState>(slot.numel, rank, size);
    slot.shard_begin = shard_begin(slot.numel, rank, size, *slot.state);
    if (carried.empty()) continue;
    std::vector<float>& worker = slot.state->worker();
    for (const BucketEntry& e : slot.entries)
      for (int64_t j = 0; j < e.numel; ++j) {
        const auto it = carried.find(flat_offset_[e.tensor] + j);
        if (it != carried.end()) worker[static_cast<size_t>(e.offset + j)] = it->second;
      }
  }
}

CompressedAllreduceState* BucketFeedback::state(int bucket) const {
  RELAXCC_ENFORCE(bucket >= 0 && bucket < static_cast<int>(slots_.size()), InvalidArgument,
                  "BucketFeedback: bucket ", bucket, " of a plan of ", slots_.size(), " buckets");
  return slots_[static_cast<size_t>(bucket)].state.get();
}

void BucketFeedback::save(StateDict& dict, const std::string& prefix) const {
  dict.put_int(prefix + "buckets", static_cast<int64_t>(slots_.size()));
  for (size_t b = 0; b < slots_.size(); ++b) {
    const std::string p = prefix + "bucket" + std::to_string(b) + "/";
    dict.put_int(p + "first_flat", first_flat(slots_[b]));
    dict.put_int(p + "numel", slots_[b].numel);
    slots_[b].state->save(dict, p);
  }
}

void BucketFeedback::load(const StateDict& dict, const std::string& prefix) {
  const int64_t buckets = dict.get_int(prefix + "buckets");
  RELAXCC_ENFORCE_EQ(buckets, static_cast<int64_t>(slots_.size()), InvalidArgument,
                     "BucketFeedback: the checkpoint's buckets ('", prefix,
                     "') and the plan's differ");
  for (size_t b = 0; b < slots_.size(); ++b) {
    const std::string p = prefix + "bucket" + std::to_string(b) + "/";
    RELAXCC_ENFORCE(dict.get_int(p + "first_flat") == first_flat(slots_[b]) &&
                        dict.get_int(p + "numel") == slots_[b].numel,
                    InvalidArgument, "BucketFeedback: bucket ", b, " of the checkpoint ('", p,
                    "') starts at flat offset ", dict.get_int(p + "first_flat"), " with ",
                    dict.get_int(p + "numel"), " elements, the plan's at ", first_flat(slots_[b]),
                    " with ", slots_[b].numel);
    slots_[b].state->load(dict, p);
  }
}

}  // namespace relaxcc::algorithms
