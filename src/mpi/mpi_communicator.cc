// create_mpi_communicator: the MPI wing's factory. It initializes MPI,
// duplicates the caller's communicator into an endpoint set (MpiEndpoints)
// within the creation timeout, and builds the transport-neutral communicator
// over an MpiTransport.
#include "relaxcc/mpi_communicator.h"

#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>
#include <utility>

#include "relaxcc/errors.h"
#include "relaxcc/logging.h"
#include "src/communicator/engine_communicator.h"
#include "src/engine/clock.h"
#include "src/engine/tunables_check.h"
#include "src/mpi/mpi_errors.h"
#include "src/mpi/mpi_transport.h"

namespace relaxcc {
namespace mpi {

using engine::Clock;
namespace {

void finalize_at_exit() {
  if (!mpi_finalized()) MPI_Finalize();
}

// Before MPI_Finalize runs, the engines still being destroyed on threads of
// their own finish (at most 15 s): MPI_Finalize deletes MPI_COMM_SELF's
// attributes first, and one of them waits for them.
void hook_finalize() {
  static const bool hooked = [] {
    int keyval = MPI_KEYVAL_INVALID;
    const auto wait_for_reaped = [](MPI_Comm, int, void*, void*) -> int {
      if (const int left = engine::wait_for_reaped_engines(std::chrono::seconds(15)); left > 0)
        RELAXCC_LOG(warn, "MPI_Finalize: ", left,
                    " communicator engine(s) still shutting down; finalizing anyway");
      return MPI_SUCCESS;
    };
    const bool ok = MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, wait_for_reaped, &keyval,
                                           nullptr) == MPI_SUCCESS &&
                    MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr) == MPI_SUCCESS;
    if (!ok) RELAXCC_LOG(warn, "cannot hook MPI_Finalize: engines reaped at exit may race it");
    return ok;
  }();
  (void)hooked;
}

void ensure_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = 0;
  if (!initialized) {
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    std::atexit(finalize_at_exit);
  } else {
    MPI_Query_thread(&provided);
  }
  RELAXCC_ENFORCE(provided >= MPI_THREAD_MULTIPLE, Unsupported,
                  "relaxcc needs MPI_THREAD_MULTIPLE, MPI provides thread level ", provided,
                  " (initialize MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...))");
}

// The two MPI_Comm_idup requests of a creation on a user's communicator that
// timed out. MPI cannot cancel a collective, so they stay parked; they are
// cached on that communicator (an MPI attribute), and the next creation on it
// waits for them instead of posting two more: when the late rank arrives, its
// creation completes them, and ranks that retry get the same communicators.
// Never freed: MPI writes the new handles into it when the requests complete.
struct ParkedDup {
  MPI_Comm comms[2] = {MPI_COMM_NULL, MPI_COMM_NULL};
  MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

int parked_dup_keyval() {
  static const int keyval = [] {
    int k = MPI_KEYVAL_INVALID;
    check_mpi(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, MPI_COMM_NULL_DELETE_FN, &k, nullptr),
              "MPI_Comm_create_keyval");
    return k;
  }();
  return keyval;
}

// Two duplicates of `comm` (relaxcc's collective and point-to-point
// communicators, with MPI_ERRORS_RETURN), from two MPI_Comm_idup posted
// together, with a timeout. While it runs, `comm` reports errors
// (MPI_ERRORS_RETURN) instead of ending the job; its own handler is restored
// afterwards. These are the only calls relaxcc makes on a user's
// communicator.
std::pair<MPI_Comm, MPI_Comm> timed_dup_pair(MPI_Comm comm, std::chrono::milliseconds timeout) {
  MPI_Errhandler user_handler;
  check_mpi(MPI_Comm_get_errhandler(comm, &user_handler), "MPI_Comm_get_errhandler");
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  struct Restore {
    MPI_Comm comm;
    MPI_Errhandler handler;
    ~Restore() {
      MPI_Comm_set_errhandler(comm, handler);
      MPI_Errhandler_free(&handler);
    }
  } restore{comm, user_handler};
  ParkedDup* dup = nullptr;
  int parked = 0;
  check_mpi(MPI_Comm_get_attr(comm, parked_dup_keyval(), &dup, &parked), "MPI_Comm_get_attr");
  if (!parked) {
    dup = new ParkedDup;
    for (int i = 0; i < 2; ++i)
      check_mpi(MPI_Comm_idup(comm, &dup->comms[i], &dup->requests[i]), "MPI_Comm_idup");
  }
  const auto deadline = Clock::now() + timeout;
  for (int64_t sleep_us = 1;; sleep_us = std::min<int64_t>(sleep_us * 2, 1000)) {
    int flag = 0;
    check_mpi(MPI_Testall(2, dup->requests, &flag, MPI_STATUSES_IGNORE), "create_mpi_communicator");
    if (flag) break;
    if (Clock::now() >= deadline) {
      if (!parked)
        check_mpi(MPI_Comm_set_attr(comm, parked_dup_keyval(), dup), "MPI_Comm_set_attr");
      RELAXCC_THROW(
          Timeout, "create_mpi_communicator: not every rank arrived within ", timeout.count(),
          " ms (its MPI_Comm_idup stays parked on the communicator; the next creation on it "
          "waits for the same)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
  }
  if (parked) MPI_Comm_delete_attr(comm, parked_dup_keyval());
  const std::pair<MPI_Comm, MPI_Comm> out{dup->comms[0], dup->comms[1]};
  delete dup;
  MPI_Comm_set_errhandler(out.first, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(out.second, MPI_ERRORS_RETURN);
  return out;
}

}  // namespace
}  // namespace mpi

CommunicatorPtr create_mpi_communicator(const MpiCommunicatorOptions& options) {
  // Before any connection: a bad tunable fails this rank alone, at once.
  engine::check_tunables(options.tunables);
  mpi::ensure_mpi();
  const auto timeout = options.timeout.count() >= 0
                           ? options.timeout
                           : std::chrono::milliseconds(options.tunables.timeout_ms);
  std::shared_ptr<engine::Transport> transport;
  if (options.share_engine_with) {
    transport = engine::transport_of(*options.share_engine_with);
    RELAXCC_ENFORCE(dynamic_cast<mpi::MpiTransport*>(transport.get()) != nullptr, InvalidArgument,
                    "create_mpi_communicator: share_engine_with is not an MPI communicator");
  } else {
    mpi::hook_finalize();  // before any engine can be reaped
    transport = std::make_shared<mpi::MpiTransport>();
  }
  // One collective on the caller's communicator; everything else on the dup.
  const auto [coll, p2p] = mpi::timed_dup_pair(options.comm, timeout);
  auto endpoints = std::make_shared<mpi::MpiEndpoints>(
      std::static_pointer_cast<mpi::MpiTransport>(transport), coll, p2p);
  engine::EngineCommunicatorOptions o;
  o.tunables = options.tunables;
  o.timeout = timeout;
  o.creator = "create_mpi_communicator";
  o.share_engine_with = options.share_engine_with;
  return engine::create_engine_communicator(std::move(transport), std::move(endpoints), o);
}

}  // namespace relaxcc
