#include "relaxcc/version.h"

namespace relaxcc {

std::string build_description() {
  return std::string(RELAXCC_VERSION_STRING) +
         (RELAXCC_HAVE_CUDA_KERNELS ? " (cuda_kernels=1" : " (cuda_kernels=0") +
         (RELAXCC_HAVE_NCCL ? ", nccl=1)" : ", nccl=0)");
}

}  // namespace relaxcc
