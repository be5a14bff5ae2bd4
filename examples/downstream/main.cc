// Links relaxcc from its installed tree and uses it across ranks: an
// allreduce whose result every rank checks.
#include <mpi.h>

#include <cstdio>
#include <vector>

#include "relaxcc/mpi_communicator.h"
#include "relaxcc/version.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rc = 0;
  {
    auto comm = relaxcc::create_mpi_communicator();
    std::vector<int> v(1000, comm->rank() + 1);
    comm->allreduce(relaxcc::TensorView::host(v.data(), 1000), relaxcc::ExecContext::host())
        ->wait();
    const int want = comm->size() * (comm->size() + 1) / 2;
    for (int x : v) rc |= x != want;
    std::printf("rank %d: relaxcc %s, allreduce %s\n", comm->rank(),
                relaxcc::build_description().c_str(), rc ? "WRONG" : "ok");
  }
  MPI_Finalize();
  return rc;
}
