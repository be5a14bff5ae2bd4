// MpiTransport and MpiEndpoints: the engine's Transport over MPI. An endpoint
// set is a pair of communicators (duplicates of one): relaxcc's tags on the
// first, users' point-to-point tags on the second.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "src/engine/transport.h"

namespace relaxcc::mpi {

// Whether MPI's progress engine calls sched_yield when a poll finds nothing
// (Open MPI's mpi_yield_when_idle, which mpirun sets for oversubscribed
// runs), read through the MPI tool interface; false when it has no such
// variable.
bool mpi_yields_when_idle();

class MpiTransport final : public engine::Transport {
 public:
  // MPI must be initialized (MPI_THREAD_MULTIPLE).
  MpiTransport();
  const char* name() const override { return "MPI"; }
  int test_some(int n, engine::Request* requests, int* indices, engine::Completion* completions,
                int& failure) override;
  bool test(engine::Request& request, engine::Completion& completion, int& failure) override;
  void cancel(engine::Request& request) override;
  void detach(engine::Request& request) override;
  std::string error_string(int code) const override;
  bool closed() const override;
  bool yields_when_idle() const override { return yields_; }
  int job_rank() const override { return job_rank_; }

 private:
  const bool yields_;
  int job_rank_ = -1;
  std::vector<MPI_Status> statuses_;  // test_some's (one caller at a time)
};

class MpiEndpoints final : public engine::Endpoints {
 public:
  // Takes ownership of `coll` and `p2p` (communicators of the same group,
  // with MPI_ERRORS_RETURN): freed with the endpoints unless MPI is
  // finalized by then.
  MpiEndpoints(std::shared_ptr<MpiTransport> transport, MPI_Comm coll, MPI_Comm p2p);
  ~MpiEndpoints() override;
  engine::Request isend(engine::Space space, const void* buf, size_t bytes, int peer,
                        int tag) override;
  engine::Request irecv(engine::Space space, void* buf, size_t bytes, int peer, int tag) override;
  bool improbe(engine::Space space, int peer, int tag, engine::Message* message,
               size_t* bytes) override;
  engine::Request imrecv(void* buf, size_t bytes, engine::Message* message) override;

 private:
  MPI_Comm comm(engine::Space space) const {
    return space == engine::Space::collective ? coll_ : p2p_;
  }
  MPI_Comm coll_;
  MPI_Comm p2p_;
};

}  // namespace relaxcc::mpi
