// create_ucx_communicator in a relaxcc built without the UCX wing
// (RELAXCC_WITH_UCX=OFF, or pkg-config found no ucx).
#include "relaxcc/errors.h"
#include "relaxcc/ucx_communicator.h"

namespace relaxcc {

bool ucx_available() {
  return false;
}

CommunicatorPtr create_ucx_communicator(const UcxCommunicatorOptions&) {
  RELAXCC_THROW(Unsupported,
                "create_ucx_communicator: this relaxcc was built without the UCX wing "
                "(configure with RELAXCC_WITH_UCX=ON and libucx-dev installed, or use "
                "create_mpi_communicator under mpirun)");
}

}  // namespace relaxcc
