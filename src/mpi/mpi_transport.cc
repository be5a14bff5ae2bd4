#include "src/mpi/mpi_transport.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <cstring>

#include "relaxcc/errors.h"
#include "src/mpi/mpi_errors.h"

namespace relaxcc::mpi {

// The engine's request slots hold MPI's handles bit for bit, so that
// test_some hands its array to MPI_Testsome as it is.
static_assert(sizeof(MPI_Request) == sizeof(engine::Request) &&
                  alignof(MPI_Request) <= alignof(engine::Request),
              "an MPI_Request must fit an engine::Request exactly");
static_assert(sizeof(MPI_Message) <= sizeof(engine::Message));
static_assert(MPI_SUCCESS == 0, "Completion::error 0 is success");

namespace {

engine::Request to_request(MPI_Request r) {
  engine::Request out;
  std::memcpy(&out.bits, &r, sizeof r);
  return out;
}
MPI_Request* as_mpi(engine::Request* r) {
  return reinterpret_cast<MPI_Request*>(r);
}
int byte_count(size_t bytes) {
  RELAXCC_ENFORCE_LE(bytes, static_cast<size_t>(INT32_MAX), InvalidArgument,
                     "one message carries at most 2^31-1 bytes");
  return static_cast<int>(bytes);
}
int peer_or_any(int peer) {
  return peer == engine::kAnySource ? MPI_ANY_SOURCE : peer;
}
// The completion of a request MPI reported done with `status` and `error`.
// Every completion of the engine passes here: Open MPI's status carries its
// byte count and cancel flag in fields of its public struct, read without
// two calls into the library; other MPIs answer MPI_Test_cancelled and
// MPI_Get_count.
void fill(engine::Completion& c, const MPI_Status& status, int error) {
  c.error = error;
  c.source = status.MPI_SOURCE;
#if defined(OPEN_MPI) && OPEN_MPI
  c.cancelled = status._cancelled != 0;
  c.bytes = c.cancelled || error != MPI_SUCCESS ? 0 : status._ucount;
#else
  int cancelled = 0;
  MPI_Test_cancelled(&status, &cancelled);
  c.cancelled = cancelled != 0;
  int got = 0;
  if (!c.cancelled && error == MPI_SUCCESS) MPI_Get_count(&status, MPI_BYTE, &got);
  c.bytes = got > 0 ? static_cast<size_t>(got) : 0;
#endif
}

}  // namespace

bool mpi_yields_when_idle() {
  // The tool interface's thread level is the process's (Open MPI records the
  // level asked for here as MPI's own).
  int level = MPI_THREAD_SINGLE, provided = 0;
  MPI_Query_thread(&level);
  if (MPI_T_init_thread(level, &provided) != MPI_SUCCESS) return false;
  bool yields = false;
  int index = -1;
  if (MPI_T_cvar_get_index("mpi_yield_when_idle", &index) == MPI_SUCCESS) {
    MPI_T_cvar_handle handle;
    int count = 0;
    if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
      // A bool or an int variable: read into zeroed room for either.
      std::array<int64_t, 8> value{};
      if (count == 1 && MPI_T_cvar_read(handle, value.data()) == MPI_SUCCESS)
        yields = std::any_of(value.begin(), value.end(), [](int64_t v) { return v != 0; });
      MPI_T_cvar_handle_free(&handle);
    }
  }
  MPI_T_finalize();
  return yields;
}

MpiTransport::MpiTransport()
    : engine::Transport(to_request(MPI_REQUEST_NULL)), yields_(mpi_yields_when_idle()) {
  MPI_Comm_rank(MPI_COMM_WORLD, &job_rank_);
}

int MpiTransport::test_some(int n, engine::Request* requests, int* indices,
                            engine::Completion* completions, int& failure) {
  if (statuses_.size() < static_cast<size_t>(n)) statuses_.resize(static_cast<size_t>(n) * 2);
  int outcount = 0;
  // Open MPI's MPI_Testsome looks for completed requests before it runs its
  // progress, not after: a call that finds none looks once more, so a
  // request that its progress completed is found now, not an iteration later
  // (not where MPI's progress yields the CPU when idle: twice the yields).
  int rc = MPI_SUCCESS;
  const int tries = yields_ ? 1 : 2;
  for (int k = 0; k < tries && rc == MPI_SUCCESS && outcount == 0; ++k)
    rc = MPI_Testsome(n, as_mpi(requests), &outcount, indices, statuses_.data());
  if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
    failure = rc;
    return 0;
  }
  failure = 0;
  if (outcount == MPI_UNDEFINED) return 0;
  for (int k = 0; k < outcount; ++k)
    fill(completions[k], statuses_[k], rc == MPI_ERR_IN_STATUS ? statuses_[k].MPI_ERROR : 0);
  return outcount;
}

bool MpiTransport::test(engine::Request& request, engine::Completion& completion, int& failure) {
  int flag = 0;
  MPI_Status status;
  const int rc = MPI_Test(as_mpi(&request), &flag, &status);
  if (flag == 0) [[likely]] {
    failure = rc;  // not MPI_SUCCESS: MPI_Test itself failed, the request stays MPI's
    return false;
  }
  failure = 0;
  fill(completion, status, rc);
  request = null_request();
  return true;
}

void MpiTransport::cancel(engine::Request& request) {
  if (request == null_request()) return;
  MPI_Cancel(as_mpi(&request));
}

void MpiTransport::detach(engine::Request& request) {
  if (request == null_request()) return;
  MPI_Request_free(as_mpi(&request));
  request = null_request();
}

std::string MpiTransport::error_string(int code) const {
  return mpi_error_string(code);
}

bool MpiTransport::closed() const {
  return mpi_finalized();
}

namespace {
int comm_size(MPI_Comm c) {
  int n = 1;
  MPI_Comm_size(c, &n);
  return n;
}
int comm_rank(MPI_Comm c) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}
int comm_max_tag(MPI_Comm c) {
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(c, MPI_TAG_UB, &ub, &flag);
  return flag && ub != nullptr ? *ub : 32767;
}
}  // namespace

MpiEndpoints::MpiEndpoints(std::shared_ptr<MpiTransport> transport, MPI_Comm coll, MPI_Comm p2p)
    : engine::Endpoints(std::move(transport), comm_rank(coll), comm_size(coll), comm_max_tag(coll)),
      coll_(coll),
      p2p_(p2p) {}

MpiEndpoints::~MpiEndpoints() {
  if (mpi_finalized()) return;
  if (coll_ != MPI_COMM_NULL) MPI_Comm_free(&coll_);
  if (p2p_ != MPI_COMM_NULL) MPI_Comm_free(&p2p_);
}

engine::Request MpiEndpoints::isend(engine::Space space, const void* buf, size_t bytes, int peer,
                                    int tag) {
  MPI_Request req;
  check_mpi(MPI_Isend(buf, byte_count(bytes), MPI_BYTE, peer, tag, comm(space), &req), "MPI_Isend");
  return to_request(req);
}

engine::Request MpiEndpoints::irecv(engine::Space space, void* buf, size_t bytes, int peer,
                                    int tag) {
  MPI_Request req;
  check_mpi(MPI_Irecv(buf, byte_count(bytes), MPI_BYTE, peer_or_any(peer), tag, comm(space), &req),
            "MPI_Irecv");
  return to_request(req);
}

bool MpiEndpoints::improbe(engine::Space space, int peer, int tag, engine::Message* message,
                           size_t* bytes) {
  int flag = 0;
  MPI_Status status;
  MPI_Message m;
  check_mpi(MPI_Improbe(peer_or_any(peer), tag, comm(space), &flag, &m, &status), "MPI_Improbe");
  if (!flag) return false;
  int count = 0;
  MPI_Get_count(&status, MPI_BYTE, &count);
  *bytes = static_cast<size_t>(count);
  *message = engine::Message{};
  std::memcpy(&message->bits, &m, sizeof m);
  return true;
}

engine::Request MpiEndpoints::imrecv(void* buf, size_t bytes, engine::Message* message) {
  MPI_Message m;
  std::memcpy(&m, &message->bits, sizeof m);
  MPI_Request req;
  check_mpi(MPI_Imrecv(buf, byte_count(bytes), MPI_BYTE, &m, &req), "MPI_Imrecv");
  *message = engine::Message{};
  return to_request(req);
}

}  // namespace relaxcc::mpi
