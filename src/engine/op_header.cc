#include "src/engine/op_header.h"

#include <string_view>
#include <vector>

#include "relaxcc/collectives/allreduce.h"
#include "relaxcc/errors.h"

namespace relaxcc::engine {

const char* op_type_name(OpType t) noexcept {
  switch (t) {
    case OpType::allreduce:
      return "allreduce";
    case OpType::reduce_scatter:
      return "reduce_scatter";
    case OpType::allgather:
      return "allgather";
    case OpType::broadcast:
      return "broadcast";
    case OpType::alltoall:
      return "alltoall";
    case OpType::barrier:
      return "barrier";
  }
  return "unknown";
}

bool same_call(const OpHeader& a, const OpHeader& b) noexcept {
  return a.magic == b.magic && a.version == b.version && a.type == b.type && a.dtype == b.dtype &&
         a.op == b.op && a.algo == b.algo && a.root == b.root && a.seq == b.seq &&
         a.lane == b.lane && a.count == b.count && a.layout == b.layout && a.agree == b.agree &&
         a.to_peer == b.from_peer && a.from_peer == b.to_peer &&
         (a.shm_pid != 0) == (b.shm_pid != 0);
}

AbortCause abort_cause(const std::exception_ptr& error) {
  AbortCause cause;
  try {
    std::rethrow_exception(error);
  } catch (const CommunicatorPoisoned& e) {
    cause = {AbortKind::poisoned, e.message()};
  } catch (const PeerLost& e) {
    cause = {AbortKind::poisoned, e.message(), e.peer()};
  } catch (const Error& e) {
    cause.reason = e.message();
  } catch (const std::exception& e) {
    cause.reason = e.what();
  } catch (...) {
  }
  return cause;
}

namespace {

bool readable(const OpHeader& h) {
  return h.magic == kHeaderMagic && h.version == kHeaderVersion;
}

// Ring and recursive-doubling operations carry an AllreduceAlgo id.
std::string algorithm_name(uint8_t algo) {
  const auto a = static_cast<AllreduceAlgo>(algo);
  if (a == AllreduceAlgo::ring || a == AllreduceAlgo::recursive_doubling)
    return std::string(allreduce_algo_name(a));
  return detail::concat("unknown algorithm ", int(algo));
}

// build::kVersion as "major.minor.patch".
std::string rank_name(int rank) {
  return rank < 0 ? "the other rank" : detail::concat("rank ", rank);
}

bool is_ring_type(OpType t) {
  return t == OpType::allreduce || t == OpType::reduce_scatter || t == OpType::allgather;
}

}  // namespace

std::string describe(const OpHeader& h, int peer) {
  if (h.magic != kHeaderMagic) return "an operation this build cannot read (a corrupt header)";
  if (h.version != kHeaderVersion)
    return detail::concat("an operation in relaxcc header format ", int(h.version),
                          " (this build uses format ", int(kHeaderVersion), ")");
  std::string what = detail::concat(op_type_name(h.type), " #", h.seq);
  const std::string_view dtype = dtype_name(h.dtype);
  switch (h.type) {
    case OpType::allreduce:
      what += detail::concat(" of ", h.count, " x ", dtype, " (", reduce_op_name(h.op), ", ",
                             algorithm_name(h.algo), ")");
      break;
    case OpType::reduce_scatter:
      what += detail::concat(" of ", h.count, " x ", dtype, " in all (", reduce_op_name(h.op), ")");
      break;
    case OpType::allgather:
      what += detail::concat(" of ", h.count, " x ", dtype, " in all");
      break;
    case OpType::broadcast:
      what += detail::concat(" of ", h.count, " x ", dtype, " from root ", h.root);
      break;
    case OpType::alltoall:
      what += detail::concat(" of ", dtype, " that sends ", h.to_peer, " elements to ",
                             rank_name(peer), " and expects ", h.from_peer, " from it");
      break;
    case OpType::barrier:
      break;
    default:
      return detail::concat("an unknown operation (type ", int(h.type), ") #", h.seq);
  }
  if (is_ring_type(h.type) && h.shm_pid != 0) what += " on a node-shared buffer";
  return what;
}

std::string describe_mismatch(int me, const OpHeader& mine, int peer, const OpHeader& theirs,
                              const std::string& agree_what) {
  std::string text = detail::concat("rank ", me, " calls ", describe(mine, peer), ", rank ", peer,
                                    " calls ", describe(theirs, me));
  if (readable(mine) && readable(theirs) && mine.agree != theirs.agree) {
    text = detail::concat(agree_what.empty()
                              ? "the arguments of the calls built on it (OpOptions::agree)"
                              : agree_what,
                          " differ: ", text);
  }
  std::vector<std::string> diffs;
  if (!readable(mine) || !readable(theirs)) {
    diffs.emplace_back("different relaxcc versions, or a corrupt message");
  } else if (mine.type != theirs.type) {
    diffs.emplace_back(mine.seq == theirs.seq
                           ? "different collectives at the same point of the call sequence"
                           : "different collectives (a rank skipped or added a call)");
  } else {
    const OpType type = mine.type;
    if (mine.seq != theirs.seq)
      diffs.emplace_back("different points of the call sequence (a rank skipped or added a call)");
    if (mine.dtype != theirs.dtype) diffs.emplace_back("different dtypes");
    if (mine.count != theirs.count) diffs.emplace_back("different element counts");
    if (mine.op != theirs.op) diffs.emplace_back("different reduce ops");
    if (mine.algo != theirs.algo) {
      diffs.emplace_back(
          type == OpType::allreduce
              ? "different algorithms (AllreduceOptions::algo, or RELAXCC_ALLREDUCE_ALGO's "
                "choice by size)"
              : "different algorithms");
    }
    if (mine.root != theirs.root) diffs.emplace_back("different roots");
    // A layout follows from the count and the algorithm: only a difference
    // in it alone is news.
    if (mine.layout != theirs.layout && mine.count == theirs.count && mine.algo == theirs.algo) {
      diffs.emplace_back(type == OpType::allgather
                             ? "different per-rank counts (allgatherv) or segment size"
                             : "different segment size or per-rank counts");
    }
    if (mine.lane != theirs.lane)
      diffs.emplace_back("operations of different communicators or groups whose messages met");
    // Per-edge counts follow from the count and the agreed arguments too
    // (except alltoallv's): they are news only when nothing else differs.
    const bool edges_news = diffs.empty() && mine.agree == theirs.agree;
    if (edges_news && mine.to_peer != theirs.from_peer)
      diffs.push_back(detail::concat("rank ", me, " sends ", mine.to_peer, " elements to rank ",
                                     peer, ", which expects ", theirs.from_peer));
    if (edges_news && mine.from_peer != theirs.to_peer)
      diffs.push_back(detail::concat("rank ", me, " expects ", mine.from_peer,
                                     " elements from rank ", peer, ", which sends ",
                                     theirs.to_peer));
    if ((mine.shm_pid != 0) != (theirs.shm_pid != 0))
      diffs.emplace_back(
          "a node-shared buffer (Communicator::allocate) on one rank and a private one on the "
          "other; shared buffers must be used on every rank or none");
  }
  for (size_t i = 0; i < diffs.size(); ++i) text += (i == 0 ? ": " : "; ") + diffs[i];
  return text;
}

}  // namespace relaxcc::engine
