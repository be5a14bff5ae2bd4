// Communicator: the interface every transport implements (MpiCommunicator,
// mpi_communicator.h; NcclCommunicator, nccl_communicator.h), and that
// relaxed primitives and algorithms are written against.
//
// Every data operation is asynchronous and returns a Work. Operations that
// involve several ranks must be called in the same order on every rank (as
// with MPI and NCCL). Each takes an ExecContext (device, stream, thread pool)
// and an options struct from relaxcc/collectives/<name>.h.
//
// Errors. Bad arguments throw InvalidArgument or Unsupported from the call
// itself. Disagreements between ranks (counts, dtypes, ops) complete the Work
// with PeerMismatch on every rank whose result depends on them (every rank for
// allreduce, reduce_scatter and allgather; see broadcast.h and alltoall.h for
// the ranks that can complete normally); the communicator stays usable. A
// point_to_point batch with a deadline completes at its deadline with a
// partial result instead of timing out (point_to_point.h). A Work that
// times out throws Timeout from wait(), naming the peers the operation still
// waited for, and POISONS the communicator:
//   - every later call throws CommunicatorPoisoned;
//   - operations in flight complete with CommunicatorPoisoned (the timed-out
//     one with Timeout);
//   - every other member is sent a poison notice and poisons its copy of the
//     communicator: its operations in flight complete with
//     CommunicatorPoisoned ("... poisoned (by rank 0: timeout of allreduce #7
//     ...; waiting for: rank 3 (header))") as soon as the notice arrives, and
//     an operation it calls after the notice arrived fails before it starts
//     (or, when the notice was still in the transport, within a millisecond
//     of starting). An idle member takes the notice in with its next call:
//     poisoned() turns true then.
//     The one outcome that can differ across ranks: a member that had
//     received everything its part of the failed operation needed before the
//     notice arrived completes it normally (its next call fails);
//   - a transport error about a peer (a lost connection, a dead process)
//     fails the operation at once with PeerLost naming the peer and
//     poisons the communicator the same way, notices included; so does a
//     heartbeat's verdict (RELAXCC_PEER_TIMEOUT_MS). A communicator poisoned
//     by a lost peer fails its operations in flight and its later calls with
//     PeerLost naming that peer (peer()) instead of CommunicatorPoisoned, on
//     every member: the notices and abort records carry the lost rank. Without
//     `mpirun --enable-recovery`, Open MPI itself ends the job when a rank
//     dies (see mpi_communicator.h);
//   - poison(reason) poisons the communicator on purpose, notices
//     included, for an error that one rank raises alone in the middle of a
//     collective sequence (a setup that fails half way): its peers'
//     operations fail at once, naming the rank and the reason, instead of
//     waiting for their timeout (relaxcc/collective_setup.h);
//   - requests already posted to the transport are parked until they drain;
//     the buffers they use stay alive through the operation's keep-alives
//     (TensorView::owner) until then. A view without an owner gets no such
//     protection: its memory must outlive the communicator.
// A poisoned communicator cannot be repaired: create a new one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "relaxcc/collectives/allgather.h"
#include "relaxcc/collectives/allreduce.h"
#include "relaxcc/collectives/alltoall.h"
#include "relaxcc/collectives/barrier.h"
#include "relaxcc/collectives/broadcast.h"
#include "relaxcc/collectives/point_to_point.h"
#include "relaxcc/collectives/reduce_scatter.h"
#include "relaxcc/exec_context.h"
#include "relaxcc/tensor.h"
#include "relaxcc/work.h"

namespace relaxcc {

struct SplitOptions {
  // split() exchanges colors and keys (an allgather) with this timeout: a
  // rank that never arrives gives Timeout (and poisons this communicator),
  // not a hang. Negative: the communicator's default timeout.
  std::chrono::milliseconds timeout{-1};
};

struct GroupOptions {
  // Tells apart groups with the same members: members must pass the same
  // key, and groups with the same members that are in use at the same time
  // must have different keys (a round number, say). Keys with the top bit
  // set belong to split() and split_node_local() (InvalidArgument).
  uint64_t key = 0;
};

// Bytes moved by a communicator's transport since creation. Read while
// operations run, each counter is current but they are not one snapshot
// (bytes_sent may not yet equal the sum of sent_to); once the operations
// completed (their Works waited for), they agree.
struct CommStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  std::vector<uint64_t> sent_to;        // per peer rank
  std::vector<uint64_t> received_from;  // per peer rank
  uint64_t operations = 0;
  // Round messages (P2POptions::round) that came after their receive gave
  // up, or that their receiver skipped, dropped unread.
  uint64_t late_messages = 0;
  // Requests this communicator's operations have posted to the transport
  // and that have not completed yet (in flight, or parked after a deadline
  // or a poisoning).
  int64_t requests_pending = 0;
  // What the transport's engine holds for the whole family of this
  // communicator (the one create_mpi_communicator made, its groups and
  // splits; 0 on other transports): communicators (lanes) alive, destroyed
  // ones that operations still hold included; operations in flight or
  // parked (with requests after a failure; background sweepers aside), as
  // of its last progress iteration; and the tag windows held for groups
  // with this rank's peers: live groups', and those of recently destroyed
  // groups, at most 32 per peer (see group()).
  int64_t engine_lanes = 0;
  int64_t engine_operations = 0;
  int64_t group_windows = 0;
  // The round trip to the ring neighbours that creation measured and every
  // rank agreed (the largest rank's; 0: not measured: one node, or
  // RELAXCC_PIPELINE_DEPTH or RELAXCC_LINK_MBIT 0), in nanoseconds; groups
  // keep their parent's. pipeline_depth: the segments this communicator's
  // ring collectives and broadcasts keep in flight per step and peer
  // (RELAXCC_PIPELINE_DEPTH). Both 0 on communicators without such rings.
  int64_t round_trip_ns = 0;
  int64_t pipeline_depth = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual bool poisoned() const = 0;
  // Poisons this communicator as a timeout does (see above): operations in
  // flight here fail, later calls throw CommunicatorPoisoned, and every
  // other member is sent a poison notice, so its operations fail with
  // CommunicatorPoisoned naming this rank and `reason` (the notice carries
  // its first 239 characters). Local; a no-op on a poisoned communicator.
  // Groups made from this communicator keep their own poison state.
  virtual void poison(const std::string& reason) = 0;
  virtual CommStats stats() const = 0;
  virtual int max_p2p_tag() const = 0;

  // A communicator over `members` (ranks of this one, in the group's rank
  // order; this rank among them), made locally: no communication, no new
  // thread or transport communicator, O(members). Every member must create
  // it with the same members and key. Its operations run on this
  // communicator's engine and connections with sequence numbers, tags and a
  // poison state of their own: a group that times out is poisoned, its
  // parent is not. Point-to-point tags are shared with the parent (and its
  // other groups). The group shares node memory (allocate) when its members
  // share a node. A group re-created after it was poisoned needs a new key.
  // Throws InvalidArgument for a rank out of range or listed twice, or a
  // list without this rank.
  //
  // Tags (MPI). A group made without communication cannot be given a tag
  // range that every rank agrees is free, and a hash of members and key
  // alone collides (two live groups would read each other's messages). So
  // each rank keeps, per parent transport communicator and per peer, the
  // tag windows that its groups with that peer hold: those of live groups
  // and of the last 32 groups with that peer destroyed (a poisoned group's
  // late messages still arrive on them). A new group takes, with each other
  // member, its first-choice window (a hash of the parent and the members
  // plus the key: groups of the same members whose keys differ by less than
  // the number of windows, 174,761 with Open MPI's ob1 and 681 with UCX,
  // never start on the same one) or, when another group holds that one, the
  // next free window of a sequence derived from its identity. Two members
  // see the same groups with each other, so they choose alike as long as
  // they create and destroy the groups that they share in the same order
  // relative to one another (as they call operations); groups created in
  // another order work as well unless their first choices collide, and
  // then their operations time out or fail with PeerMismatch, never mixing
  // data unnoticed. When a window leaves that list, the messages still
  // queued on it from that peer are received and dropped (a poisoned
  // group's at once, when it is destroyed), so that the sends a peer left
  // parked complete and nothing of the group stays: per peer, a destroyed
  // group leaves only its window in the list (CommStats::group_windows).
  // Throws CommunicationError when live groups with one peer hold every
  // window.
  virtual std::shared_ptr<Communicator> group(const std::vector<int>& members,
                                              const GroupOptions& options = {}) = 0;
  // Collective over this communicator: ranks with equal color form a group
  // (see group()), ordered by key then rank. A negative color returns null.
  // Every rank must call split() and split_node_local() in the same order.
  virtual std::shared_ptr<Communicator> split(int color, int key,
                                              const SplitOptions& options = {}) = 0;
  // The group of the ranks that share this rank's node (memory domain), known
  // since creation: no communication.
  virtual std::shared_ptr<Communicator> split_node_local(const SplitOptions& options = {}) = 0;

  // The communicator over the same ranks, with the same rank numbers, that
  // moves host memory, for the small host-side exchanges of code written for
  // any communicator (the Reducer's agreements, build_hierarchy's node ids):
  // a device communicator's bootstrap (an NCCL communicator's MPI
  // communicator), or null when this communicator moves host memory itself
  // (MPI). Local: no communication. Collectives on the two are ordered
  // independently of each other.
  virtual std::shared_ptr<Communicator> host_communicator() const { return nullptr; }

  // Memory for collective buffers, like ncclMemAlloc: `numel` zeroed elements, freed when the
  // view's owner is released. Local, not collective. On a communicator whose ranks share one node
  // it is node-shared memory, and an allreduce whose output, a reduce_scatter whose input, or an
  // allgather(v) whose output every rank took from here reads its neighbour's data in place
  // instead of copying it through the transport. All ranks of one such collective must pass such
  // buffers, or none (otherwise PeerMismatch). Throws CommunicationError when the system has no
  // shared memory left.
  virtual TensorView allocate(int64_t numel, DType dtype) = 0;
  // `bytes` zeroed bytes of host memory for an operation's own buffers (the payloads a relaxed
  // primitive encodes on the host), freed or reused once the view's owner is released: an MPI
  // communicator takes them from a pool that it shares with the groups made from it, so a call
  // that needs the same sizes call after call does not fault fresh pages in every time. Process
  // memory, never node-shared (unlike allocate()'s): collectives move it as any other buffer.
  // Local, not collective. The default allocates fresh memory.
  virtual TensorView host_scratch(int64_t bytes) {
    auto memory = std::make_shared<std::vector<unsigned char>>(static_cast<size_t>(bytes));
    return TensorView(memory->data(), bytes, DType::u8, Device::host(), memory);
  }

  virtual WorkPtr point_to_point(const std::vector<P2POp>& ops, const ExecContext& ctx,
                                 const P2POptions& options = {}) = 0;
  // Allreduce of `input` into `output` (same count and dtype), as ncclAllReduce: in place when
  // both are the same view, otherwise the two must not overlap and `input` is left as it was.
  virtual WorkPtr allreduce(const TensorView& input, const TensorView& output,
                            const ExecContext& ctx, const AllreduceOptions& options = {}) = 0;
  // In place: allreduce(data, data, ctx, options).
  WorkPtr allreduce(const TensorView& data, const ExecContext& ctx,
                    const AllreduceOptions& options = {}) {
    return allreduce(data, data, ctx, options);
  }
  virtual WorkPtr reduce_scatter(const TensorView& input, const TensorView& output,
                                 const ExecContext& ctx,
                                 const ReduceScatterOptions& options = {}) = 0;
  virtual WorkPtr allgather(const TensorView& input, const TensorView& output,
                            const ExecContext& ctx, const AllgatherOptions& options = {}) = 0;
  virtual WorkPtr allgatherv(const TensorView& input, const TensorView& output,
                             const std::vector<int64_t>& counts, const ExecContext& ctx,
                             const AllgatherOptions& options = {}) = 0;
  virtual WorkPtr broadcast(const TensorView& data, const ExecContext& ctx,
                            const BroadcastOptions& options = {}) = 0;
  virtual WorkPtr alltoall(const TensorView& input, const TensorView& output,
                           const ExecContext& ctx, const AlltoallOptions& options = {}) = 0;
  virtual WorkPtr alltoallv(const TensorView& input, const std::vector<int64_t>& send_counts,
                            const TensorView& output, const std::vector<int64_t>& recv_counts,
                            const ExecContext& ctx, const AlltoallOptions& options = {}) = 0;
  virtual WorkPtr barrier(const BarrierOptions& options = {}) = 0;

  // Runs the host function `fn` off the thread that moves this
  // communicator's data (for an MPI communicator, its engine's compute
  // thread, shared by the communicators of one engine), once options.after
  // (if any) completed, so that transfers go on meanwhile: a codec encodes
  // the next segment while this one is on the wire. Local, not collective:
  // no sequence number, no tag. Functions run one at a time, in the order
  // they become ready (priority is not used). The Work completes once `fn`
  // returned, with what it threw. If options.after failed, or the
  // communicator is poisoned before `fn` started, the Work fails
  // (CommunicationError, CommunicatorPoisoned) and `fn` never runs; once it
  // started, its own result stands. On a communicator poisoned already,
  // compute throws CommunicatorPoisoned. `fn` follows the rules of a
  // completion callback (work.h): it must not wait on Works.
  virtual WorkPtr compute(std::function<void()> fn, const OpOptions& options = {}) = 0;
};

using CommunicatorPtr = std::shared_ptr<Communicator>;

}  // namespace relaxcc
