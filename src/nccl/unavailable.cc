// create_nccl_communicator in a build without NCCL: it reports the situation
// to the caller; it never pretends to run.
#include "relaxcc/errors.h"
#include "relaxcc/nccl_communicator.h"

namespace relaxcc {

CommunicatorPtr create_nccl_communicator(const NcclCommunicatorOptions&) {
  RELAXCC_THROW(Unsupported, "create_nccl_communicator: relaxcc was built without NCCL (",
                RELAXCC_NCCL_UNAVAILABLE_REASON, ")");
}

}  // namespace relaxcc
