#include "src/nccl/device_checks.h"

#include "relaxcc/errors.h"

namespace relaxcc::nccl {

void check_device_tensor(const std::string& who, const char* what, const std::string& label,
                         const TensorView& t, const ExecContext& ctx, int device) {
  const Device expected = Device::cuda(device);
  const std::string name = detail::concat(what, detail::of_label(label));
  RELAXCC_ENFORCE(t.device.is_cuda(), InvalidArgument, who, ": ", name, " is on ", t.device,
                  ": the NCCL communicator moves device memory of ", expected,
                  " (host tensors go through the MPI communicator)");
  RELAXCC_ENFORCE(t.device == expected, InvalidArgument, who, ": ", name, " is on ", t.device,
                  ", but this NCCL communicator drives ", expected);
  RELAXCC_ENFORCE(ctx.device == expected, InvalidArgument, who, ": ", name,
                  ": ExecContext::device is ", ctx.device, ", but this NCCL communicator drives ",
                  expected);
}

}  // namespace relaxcc::nccl
