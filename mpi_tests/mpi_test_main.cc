// GoogleTest main for programs that run under mpiexec.
//
// - MPI is initialized at MPI_THREAD_MULTIPLE, the level relaxcc needs.
// - Only rank 0 prints gtest's normal output; every rank prints its own
//   failures, prefixed with its rank.
// - A failed assertion on any rank calls MPI_Abort, so the other ranks do not
//   sit in a collective until the CTest timeout: a fatal failure aborts at
//   once, a non-fatal one at the end of its test. (MPI_Abort is for tests
//   only; the library never aborts.)
// - The exit code is nonzero when any rank failed.
#include <mpi.h>

#include <cstdio>

#include <gtest/gtest.h>

#include "test_util.h"

namespace {

class AbortOnFailure : public testing::EmptyTestEventListener {
 public:
  explicit AbortOnFailure(int rank) : rank_(rank) {}

  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] FAILURE at %s:%d\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.summary());
    std::fflush(stderr);
    if (result.fatally_failed()) abort_job();
  }

  void OnTestEnd(const testing::TestInfo& info) override {
    if (info.result()->Failed()) abort_job();
  }

 private:
  void abort_job() {
    std::fprintf(stderr, "[rank %d] aborting the job after a failed assertion\n", rank_);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) {
    std::fprintf(stderr, "MPI provides thread level %d, tests need MPI_THREAD_MULTIPLE\n",
                 provided);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  testing::InitGoogleTest(&argc, argv);
  auto& listeners = testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new AbortOnFailure(rank));

  int local = RUN_ALL_TESTS();
  relaxcc::test::world_slot().reset();  // its engine frees MPI objects: before MPI_Finalize
  int global = 0;
  MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  relaxcc::test::store_slot().reset();  // the UCX wing's store: once nobody uses it
  MPI_Finalize();
  return global;
}
