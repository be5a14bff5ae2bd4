// Membership views and the agreement on the next view (elastic membership).
//
// A MembershipView is an epoch number and its member list: the process ranks
// (ranks of the job's first view, stable for a process's life) that run
// operations together in that epoch. Epoch e+1 follows epoch e when members
// are lost; no operation mixes two views.
//
// agree_next_view: the survivors of view `current` agree on view
// current.epoch + 1 through a Store shared by the job (the rendezvous store).
// Every caller that returns gets the same view; a caller that is not in it
// (reported lost while alive) gets Excluded and must rejoin. The protocol and
// its failure cases are in docs/architecture.md ("Membership agreement").
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "relaxcc/communicator.h"
#include "relaxcc/errors.h"
#include "relaxcc/tunables.h"

namespace relaxcc {

class Store;

struct MembershipView {
  // 0 for the job's first view; each agreement adds 1.
  uint64_t epoch = 0;
  // Process ranks, ascending, without repeats.
  std::vector<int> members;

  // The position of `process_rank` in members (its rank on this view), or -1.
  int rank_of(int process_rank) const;
  bool contains(int process_rank) const { return rank_of(process_rank) >= 0; }
  int size() const { return static_cast<int>(members.size()); }
  // "epoch 3 {0,2,3}", for messages.
  std::string describe() const;
  // FNV-1a (hash.h) of the epoch and the member list: the agreement's store
  // keys and shrink's rendezvous job carry it, so groups that share a store
  // and an epoch never read each other's records.
  uint64_t fingerprint() const;
  bool operator==(const MembershipView& other) const = default;
};

// This process was left out of the view its peers agreed on (they reported it
// lost, it reported a member lost that the others hear from, or it arrived
// after the decision): it runs no more operations on that view or the earlier
// ones and must rejoin. view() is the view decided.
class Excluded : public CommunicationError {
 public:
  Excluded(int process_rank, MembershipView view, std::string message, const char* file, int line)
      : CommunicationError("Excluded", std::move(message), file, line),
        process_rank_(process_rank),
        view_(std::move(view)) {}
  int process_rank() const noexcept { return process_rank_; }
  const MembershipView& view() const noexcept { return view_; }

 private:
  int process_rank_;
  MembershipView view_;
};

struct AgreementOptions {
  // How long a caller waits for the proposal of a member that no majority
  // reports lost: a member whose proposal has not come by then is left out
  // (it failed or stalled during the agreement). A caller returns within
  // `timeout` plus its store calls. Must be positive.
  std::chrono::milliseconds timeout{10000};
  // Prefix of the store keys; jobs sharing a store use different prefixes.
  // Keys: <key_prefix>/<current.fingerprint()>/epoch<E>/{proposal/<m>,
  // proposals,decision}, E = current.epoch + 1, fingerprint in decimal.
  std::string key_prefix = "relaxcc/membership";
};

// The view that follows `current`, agreed by its members through `store`.
// `self` is this process's rank, a member of `current`; `lost` are the
// members this caller has its own evidence against (PeerLost, the transport,
// the heartbeat), process ranks of `current`.
//
// A member is left out when it has not proposed by the time the view is
// decided, when a strict majority of the other proposers report it lost, or
// when it reports lost a member that stays (a minority accuser: the link at
// fault is most likely its own; of two that accuse each other, the higher
// rank goes and the other stays). A caller decides only once every member
// has proposed, except those that a strict majority of the view's other
// members report lost, or when `options.timeout` has passed: a slow member
// that nobody (or only a minority) reports lost is waited for. The first
// decision stored is final, so every caller gets the same view.
//
// Returns the view decided (epoch current.epoch + 1, a subset of current);
// Excluded when `self` is not in it; PeerMismatch when the store holds a
// decision or proposal under this view's keys that is not one of
// `current` (naming what differs); InvalidArgument for a `self` or `lost`
// outside `current` and for options out of range; the store's errors.
MembershipView agree_next_view(Store& store, const MembershipView& current, int self,
                               const std::vector<int>& lost, const AgreementOptions& options = {});

// ---- shrink (shaped as ncclCommRevoke + ncclCommShrink) ----------------------

struct ShrinkOptions {
  // The job's rendezvous store (the agreement's and the new rendezvous').
  std::shared_ptr<Store> store;
  // Ranks of the communicator being shrunk that this process saw lost
  // (PeerLost::peer(), the heartbeat), or none; shrink maps them to process
  // ranks through the view. This process's own rank is comm.rank().
  std::vector<int> lost_ranks;
  AgreementOptions agreement;
  // Bounds each creation of the new communicator (rendezvous and handshake).
  std::chrono::milliseconds create_timeout{10000};
  // No further attempt starts after this, counted from the call: the last
  // one ends at most agreement.timeout + create_timeout later.
  std::chrono::milliseconds timeout{30000};
  // Rendezvous keys of the new communicator: job "<job>/<view fingerprint>",
  // generation = the view's epoch.
  std::string job = "relaxcc-shrink";
  Tunables tunables = Tunables::from_env();
  bool share_memory = true;
  std::string net_devices = "auto";
};

struct ShrinkResult {
  MembershipView view;
  CommunicatorPtr comm;
};

// Collective over the survivors of `current`, the view `comm` runs on (comm
// rank r is process current.members[r]). Poisons `comm` first, so that its
// operations in flight and later fail (revoke), runs agree_next_view, then
// creates a UCX communicator over the view decided (rank = position in
// view.members) with the epoch as its endpoint set's tag generation and a
// fresh worker: no message of `comm` matches one of the new communicator.
//
// As ncclCommShrink, it returns a working communicator or throws. When a
// member of the decided view fails before the new communicator exists (its
// creation ends with Timeout or a CommunicationError), shrink agrees again
// from that view, where the member that never came is left out at
// agreement.timeout, and creates that view's communicator: the returned
// view's epoch may be more than current.epoch + 1. It stops retrying once
// ShrinkOptions::timeout has passed: Timeout naming the last view decided
// and the creation's error. Throws Excluded when this process was left out
// of a view (it must rejoin); InvalidArgument when comm and current differ
// in size or a lost rank is not a peer's rank of comm; PeerMismatch as
// agree_next_view; Unsupported without the UCX wing.
ShrinkResult shrink(Communicator& comm, const MembershipView& current,
                    const ShrinkOptions& options);

// ---- Elastic training ----------------------------------------------------------

// What a Reducer needs to go on without lost members (ReducerOptions::elastic,
// reducer.h): the view its communicator runs on and how to shrink it.
struct ElasticOptions {
  // Communicator rank r is process view.members[r].
  MembershipView view;
  // The store, timeouts and UCX settings of each shrink; lost_ranks is
  // filled in from the rank that the poisoned communicator names lost.
  // shrink.agreement.timeout must exceed a step's compute time: a survivor
  // joins the agreement when it reaches synchronize().
  ShrinkOptions shrink;
  // Views changed within one iteration before the Reducer gives up and
  // rethrows the step's PeerLost.
  int max_view_changes_per_iteration = 3;
};

}  // namespace relaxcc
