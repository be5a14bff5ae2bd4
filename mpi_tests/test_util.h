// Helpers shared by relaxcc's MPI tests: world rank/size, and test data that
// encodes the rank and the index of every element (as Gloo's assignValues).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "relaxcc/dtype.h"

namespace relaxcc::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// A small integer that encodes (rank, index): exact in every dtype, sums of
// up to 4 ranks included (u8 sums wrap mod 256, as u8 arithmetic does).
inline int64_t encode(int rank, int64_t index) { return (rank + 1) * 3 + (index % 11) * 5; }

}  // namespace relaxcc::test
