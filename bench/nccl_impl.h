// Allreduce on device buffers for `relaxcc-bench allreduce`, so that
// relaxcc's NCCL path is measured against bare NCCL in the same run:
//   nccl          ncclAllReduce on a communicator and stream of its own,
//                 then cudaStreamSynchronize (nccl-tests' loop body)
//   relaxcc-nccl  NcclCommunicator::allreduce ordered after a stream of the
//                 caller's, then Work::wait (relaxcc's whole path: argument
//                 checks, event wait, NCCL call, completion event, polling)
// Each rank drives the GPU of its index on the node. Both use the same kind
// of buffers (cudaMalloc), and the untimed reset before each run leaves the
// device idle; the check copies the result to the host and compares it
// exactly.
#pragma once

#include <string>

#include "bench_util.h"
#include "relaxcc/reduce_op.h"
#include "sweep.h"

namespace relaxcc::bench {

bool is_nccl_impl(const std::string& name);
// Throws Unsupported, with the reason, in a build without NCCL or on a
// machine without a CUDA device for this rank.
SweepImpl make_nccl_sweep_impl(const std::string& name, bool in_place, ReduceOp op,
                               BenchWorld& world);

}  // namespace relaxcc::bench
