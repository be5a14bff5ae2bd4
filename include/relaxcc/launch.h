// LaunchEnvironment: how this process was started, from the variables its
// launcher sets. The one reader of them: process_rank() (errors and log
// lines), RendezvousOptions::from_env (relaxcc/rendezvous.h), the Python
// package's choice of wing and relaxcc-bench's choice of MPI.
#pragma once

#include <string>

namespace relaxcc {

enum class Launcher {
  none,      // none of the variables below is set
  mpi,       // an MPI launcher, whose job MPI_Init joins: Open MPI's mpirun
             // (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE), a PMIx launcher
             // (PMIX_RANK) or a PMI one, such as MPICH's hydra or
             // srun --mpi=pmi2 (PMI_RANK, PMI_SIZE)
  torchrun,  // torchrun, or an env:// start by hand (RANK, WORLD_SIZE)
  srun,      // Slurm without an MPI process manager (SLURM_PROCID, SLURM_NTASKS)
};
const char* launcher_name(Launcher l) noexcept;  // "none", "mpi", "torchrun", "srun"

struct LaunchEnvironment {
  // The first kind in the order mpi, torchrun, srun whose variables are set.
  Launcher launcher = Launcher::none;
  // This process's rank, the number of processes and its rank on its node
  // (-1 where no variable gives it), each from the first variable set of:
  // - rank: RANK, OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK, SLURM_PROCID;
  // - size: WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS;
  // - local_rank: LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID
  // (torchrun's first: torchrun under srun sets them for its workers; under
  // an MPI launcher its rank and size variables come first instead).
  int rank = -1;
  int size = -1;
  int local_rank = -1;
  // The variables they came from (empty where none was set).
  std::string rank_variable, size_variable;

  // Reads the environment (a variable set to "" counts as unset). Throws
  // InvalidArgument naming a variable whose value is not an integer in range.
  static LaunchEnvironment from_env();
};

}  // namespace relaxcc
