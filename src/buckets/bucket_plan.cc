#include "relaxcc/bucket_plan.h"

#include <algorithm>
#include <map>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"

namespace relaxcc {

BucketPlan BucketPlan::build(const std::vector<TensorSpec>& tensors, std::vector<int> order,
                             const BucketPlanOptions& options, TensorRole role) {
  RELAXCC_ENFORCE(
      options.cap_bytes > 0 && options.first_cap_bytes > 0 && options.alignment_bytes > 0,
      InvalidArgument, "bucket plan: caps and alignment must be positive");
  const int n = static_cast<int>(tensors.size());
  if (order.empty()) {
    for (int i = n - 1; i >= 0; --i) order.push_back(i);
  }
  RELAXCC_ENFORCE_EQ(static_cast<int>(order.size()), n, InvalidArgument,
                     "bucket plan: order length");
  std::vector<char> seen(n, 0);
  for (int i : order) {
    RELAXCC_ENFORCE(i >= 0 && i < n && !seen[i], InvalidArgument,
                    "bucket plan: order must list every tensor once, got ", i);
    seen[i] = 1;
  }
  BucketPlan plan;
  plan.order_ = order;
  plan.where_.assign(n, {-1, -1});
  // One open bucket per dtype; the first bucket of the plan has a smaller cap.
  std::map<DType, int> open;
  for (int i : order) {
    const TensorSpec& t = tensors[i];
    if (t.role != role) continue;
    t.view.check_valid(t.name.c_str());
    const int64_t esize = static_cast<int64_t>(dtype_size(t.view.dtype));
    const int64_t align = std::max<int64_t>(1, options.alignment_bytes / esize);
    auto it = open.find(t.view.dtype);
    if (it != open.end()) {
      Bucket& b = plan.buckets_[it->second];
      const int64_t start = (b.numel + align - 1) / align * align;
      const int64_t cap = it->second == 0 ? options.first_cap_bytes : options.cap_bytes;
      if ((start + t.view.numel) * esize > cap && !b.entries.empty()) open.erase(it);
    }
    it = open.find(t.view.dtype);
    if (it == open.end()) {
      plan.buckets_.push_back(Bucket{t.view.dtype, 0, {}});
      it = open.emplace(t.view.dtype, static_cast<int>(plan.buckets_.size()) - 1).first;
    }
    Bucket& b = plan.buckets_[it->second];
    const int64_t start = (b.numel + align - 1) / align * align;
    plan.where_[i] = {it->second, static_cast<int>(b.entries.size())};
    b.entries.push_back(BucketEntry{i, start, t.view.numel});
    b.numel = start + t.view.numel;
  }
  return plan;
}

std::pair<int, int> BucketPlan::locate(int tensor) const {
  RELAXCC_ENFORCE(tensor >= 0 && tensor < static_cast<int>(where_.size()), InvalidArgument,
                  "bucket plan: tensor ", tensor, " is not registered");
  return where_[tensor];
}

uint64_t BucketPlan::hash(const std::vector<TensorSpec>& tensors) const {
  Fnv1a h;
  for (const TensorSpec& t : tensors) {
    for (char c : t.name) h.u64(static_cast<unsigned char>(c));
    h.u64(static_cast<uint64_t>(t.view.dtype));
    h.u64(static_cast<uint64_t>(t.view.numel));
    h.u64(static_cast<uint64_t>(t.role));
  }
  for (const Bucket& b : buckets_) {
    h.u64(static_cast<uint64_t>(b.numel));
    for (const BucketEntry& e : b.entries)
      h.u64(static_cast<uint64_t>(e.tensor) << 32 ^ static_cast<uint64_t>(e.offset));
  }
  return h.value();
}

}  // namespace relaxcc
