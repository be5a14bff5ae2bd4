// Links relaxcc from its installed tree and uses it across ranks: an
// allreduce whose result every rank checks. `--transport ucx` puts the
// communicator on the UCX wing (rendezvous from the environment).
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

#include "relaxcc/create_communicator.h"
#include "relaxcc/version.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rc = 0;
  {
    const std::string transport =
        argc == 3 && std::string(argv[1]) == "--transport" ? argv[2] : "mpi";
    auto comm = relaxcc::create_communicator(transport);
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
