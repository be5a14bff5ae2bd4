// The device implementations of relaxcc-bench allreduce in a build without
// NCCL: they report it, they never pretend to run.
#include "nccl_impl.h"
#include "relaxcc/errors.h"

namespace relaxcc::bench {

bool is_nccl_impl(const std::string& name) {
  return name == "nccl" || name == "relaxcc-nccl";
}

SweepImpl make_nccl_sweep_impl(const std::string& name, bool, ReduceOp, BenchWorld&) {
  RELAXCC_THROW(Unsupported, "--impl ", name, ": relaxcc-bench was built without NCCL");
}

}  // namespace relaxcc::bench
