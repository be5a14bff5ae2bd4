// The wing chosen by name, for programs that take `--transport mpi|ucx`
// (relaxcc-bench, relaxcc-train, the examples).
#pragma once

#include <string_view>

#include "relaxcc/communicator.h"
#include "relaxcc/tunables.h"

namespace relaxcc {

// "mpi": create_mpi_communicator over MPI_COMM_WORLD (under mpirun).
// "ucx": create_ucx_communicator with its options from the environment
// (RELAXCC_RENDEZVOUS or MASTER_ADDR/MASTER_PORT, RANK/WORLD_SIZE or the
// launchers' variables; see ucx_communicator.h), with or without mpirun.
// Both with `tunables`. Throws InvalidArgument for another name, and what
// the factory throws.
CommunicatorPtr create_communicator(std::string_view transport,
                                    const Tunables& tunables = Tunables::from_env());

}  // namespace relaxcc
