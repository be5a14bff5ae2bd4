#include "relaxcc/create_communicator.h"

#include "relaxcc/errors.h"
#include "relaxcc/mpi_communicator.h"
#include "relaxcc/ucx_communicator.h"

namespace relaxcc {

CommunicatorPtr create_communicator(std::string_view transport, const Tunables& tunables) {
  if (transport == "mpi") {
    MpiCommunicatorOptions o;
    o.tunables = tunables;
    return create_mpi_communicator(o);
  }
  RELAXCC_ENFORCE(transport == "ucx", InvalidArgument, "unknown transport '", transport,
                  "': expected mpi or ucx");
  UcxCommunicatorOptions o;
  o.tunables = tunables;
  return create_ucx_communicator(o);
}

}  // namespace relaxcc
