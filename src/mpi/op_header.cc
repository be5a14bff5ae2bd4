#include "op_header.h"

#include "relaxcc/errors.h"

namespace relaxcc::mpi {

const char* op_type_name(OpType t) noexcept {
  switch (t) {
    case OpType::allreduce: return "allreduce";
    case OpType::reduce_scatter: return "reduce_scatter";
    case OpType::allgather: return "allgather";
    case OpType::broadcast: return "broadcast";
    case OpType::alltoall: return "alltoall";
    case OpType::barrier: return "barrier";
    case OpType::handshake: return "handshake";
  }
  return "unknown";
}

bool same_call(const OpHeader& a, const OpHeader& b) noexcept {
  return a.magic == b.magic && a.version == b.version && a.type == b.type && a.dtype == b.dtype &&
         a.op == b.op && a.algo == b.algo && a.root == b.root && a.seq == b.seq &&
         a.count == b.count && a.layout == b.layout && a.to_peer == b.from_peer &&
         a.from_peer == b.to_peer && (a.shm_pid != 0) == (b.shm_pid != 0);
}

AbortCause abort_cause(const std::exception_ptr& error) {
  AbortCause cause;
  try {
    std::rethrow_exception(error);
  } catch (const CommunicatorPoisoned& e) {
    cause = {AbortKind::poisoned, e.message()};
  } catch (const Error& e) {
    cause.reason = e.message();
  } catch (const std::exception& e) {
    cause.reason = e.what();
  } catch (...) {
  }
  return cause;
}

std::string describe(const OpHeader& h) {
  if (h.magic != kHeaderMagic || h.version != kHeaderVersion)
    return detail::concat("a corrupt header (magic ", h.magic, ", version ", int(h.version), ")");
  return detail::concat(op_type_name(h.type), " #", h.seq, " count=", h.count, " dtype=", h.dtype,
                        " op=", h.op, " algo=", int(h.algo), " root=", h.root, " layout=", h.layout,
                        " sends=", h.to_peer, " expects=", h.from_peer,
                        h.shm_pid != 0 ? " on a shared buffer" : "");
}

}  // namespace relaxcc::mpi
