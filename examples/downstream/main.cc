// Links relaxcc from its installed tree and uses it across ranks.
#include <mpi.h>

#include <cstdio>

#include "relaxcc/version.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::printf("rank %d: relaxcc %s\n", rank, relaxcc::build_description().c_str());
  MPI_Finalize();
  return 0;
}
