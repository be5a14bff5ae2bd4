#!/usr/bin/env bash
# relaxcc's main job on a fresh Debian 12 machine: installs the packages,
# builds the release preset, then runs the allreduce sweep of relaxcc-bench on
# 4 ranks, relaxcc (ordinary and shared buffers) against Open MPI's MPI_Allreduce
# in the same run.
# Extra arguments go to `relaxcc-bench allreduce`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release -DRELAXCC_BUILD_TESTS=OFF
cmake --build --preset release
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec mpirun -n 4 --oversubscribe --bind-to none build/release/bench/relaxcc-bench allreduce \
  -b 1K -e 64M -f 4 -n 10 -w 3 --impl relaxcc,relaxcc-shared,mpi "$@"
