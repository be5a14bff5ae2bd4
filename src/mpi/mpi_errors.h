// MPI return codes as relaxcc errors, and whether MPI may still be called.
#pragma once

#include <string>

namespace relaxcc::mpi {

// Throws CommunicationError naming `what` when rc is not MPI_SUCCESS.
void check_mpi(int rc, const char* what);
std::string mpi_error_string(int rc);
// Whether MPI_Finalize has run (relaxcc then makes no MPI call).
bool mpi_finalized();

}  // namespace relaxcc::mpi
