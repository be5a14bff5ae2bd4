#include "relaxcc/version.h"

#include "relaxcc/errors.h"

namespace relaxcc {

std::string build_description() {
  return detail::concat(RELAXCC_VERSION_STRING, " (cuda=", RELAXCC_HAVE_CUDA,
                        " nccl=", RELAXCC_HAVE_NCCL, " torch=", RELAXCC_HAVE_TORCH, ")");
}

}  // namespace relaxcc
