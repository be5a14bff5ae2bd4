#include "src/mpi/mpi_errors.h"

#include <mpi.h>
#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <sstream>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "relaxcc/logging.h"

namespace relaxcc::mpi {

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, len);
}

void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) [[unlikely]]
    RELAXCC_THROW(CommunicationError, what, " failed: ", mpi_error_string(rc));
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

}  // namespace relaxcc::mpi
