// Registered tensors and the bucket plan that flattens them.
//
// Users register tensors in order, each with a name, a TensorView and a role.
// A BucketPlan packs them, in a given order (by default the reverse of
// registration, the order in which backward produces gradients), into
// contiguous buckets of one dtype each, up to a byte cap, with a smaller
// first bucket so that communication starts early (PyTorch DDP: 25 MiB and
// 1 MiB). Each tensor starts at an aligned offset within its bucket.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "relaxcc/tensor.h"

namespace relaxcc {

enum class TensorRole : uint8_t { gradient = 0, parameter = 1, optimizer_state = 2 };

struct TensorSpec {
  std::string name;
  TensorView view;
  TensorRole role = TensorRole::gradient;
  int partner = -1;  // a gradient's parameter (registration index), or -1
};

struct BucketPlanOptions {
  int64_t cap_bytes = int64_t{25} << 20;
  int64_t first_cap_bytes = int64_t{1} << 20;
  int64_t alignment_bytes = 64;  // each tensor's offset within a bucket
};

struct BucketEntry {
  int tensor = 0;      // index in registration order
  int64_t offset = 0;  // elements from the bucket's start
  int64_t numel = 0;
};

struct Bucket {
  DType dtype = DType::f32;
  int64_t numel = 0;  // including alignment padding
  std::vector<BucketEntry> entries;
};

class BucketPlan {
 public:
  BucketPlan() = default;
  // `order` lists tensor indices in the order to pack them (every index
  // once); empty means reverse registration order. Only tensors whose role
  // is `role` are packed. Throws InvalidArgument for a bad order or options.
  static BucketPlan build(const std::vector<TensorSpec>& tensors, std::vector<int> order,
                          const BucketPlanOptions& options, TensorRole role = TensorRole::gradient);

  const std::vector<Bucket>& buckets() const noexcept { return buckets_; }
  // (bucket, entry index) of a packed tensor; bucket -1 when not packed.
  std::pair<int, int> locate(int tensor) const;
  // The packing order this plan was built from.
  const std::vector<int>& order() const noexcept { return order_; }
  // FNV-1a over every tensor's name, dtype and numel and every bucket boundary.
  uint64_t hash(const std::vector<TensorSpec>& tensors) const;

 private:
  std::vector<Bucket> buckets_;
  std::vector<std::pair<int, int>> where_;
  std::vector<int> order_;
};

}  // namespace relaxcc
