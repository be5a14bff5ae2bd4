// The NCCL communicator's own argument rule, after the transport-neutral
// checks (collectives/argument_checks.h): tensors and the ExecContext live on
// the communicator's CUDA device. Plain C++ (no CUDA), built in every
// configuration, so that the rule is tested without a device.
#pragma once

#include <string>

#include "relaxcc/exec_context.h"
#include "relaxcc/tensor.h"

namespace relaxcc::nccl {

// Throws InvalidArgument naming `who` ("rank 1 (cuda:0)"), the operation,
// the tensor (`what`, and `label` when not empty), the device it is on and
// the communicator's device, when `t` or `ctx` is not on cuda:`device`.
void check_device_tensor(const std::string& who, const char* what, const std::string& label,
                         const TensorView& t, const ExecContext& ctx, int device);

}  // namespace relaxcc::nccl
