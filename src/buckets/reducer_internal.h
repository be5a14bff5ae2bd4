// Shared by reducer.cc and reducer_agreements.cc (the Reducer's cross-rank
// agreements): where an entry lives in its bucket's storage, and how a set
// of ranks is named in messages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "relaxcc/bucket_plan.h"
#include "relaxcc/dtype.h"
#include "relaxcc/tensor.h"

namespace relaxcc::detail {

inline char* slot_ptr(const TensorView& storage, const BucketEntry& e, DType dtype) {
  return static_cast<char*>(storage.data) + e.offset * static_cast<int64_t>(dtype_size(dtype));
}

// "rank 0", "ranks 1-3", "ranks 0,2-5,7": the ranks r with marks[r] == want.
std::string rank_list(const std::vector<uint8_t>& marks, uint8_t want);

}  // namespace relaxcc::detail
