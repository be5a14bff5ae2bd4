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
  bool operator==(const MembershipView& other) const = default;
};

// This process was left out of the view its peers agreed on (they reported it
// lost, or it arrived after the decision): it runs no more operations on that
// view or the earlier ones and must rejoin. view() is the view decided.
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
  // The whole agreement: Timeout (naming the epoch and the members whose
  // proposals are missing) when no view is decided by then.
  std::chrono::milliseconds timeout{10000};
  // How long a proposer waits for the proposal of a member it believes alive
  // before it counts that member as lost too (a second failure during the
  // agreement). At most `timeout`.
  std::chrono::milliseconds proposal_wait{2000};
  // Prefix of the store keys; jobs sharing a store use different prefixes.
  std::string key_prefix = "relaxcc/membership";
};

// The view that follows `current` once `lost` (process ranks this caller
// reports lost: from PeerLost, a poison notice or the heartbeat) are left
// out. `self` is this process's rank; it must be a member of `current`.
// Returns the view decided (epoch current.epoch + 1), the same for every
// caller; Excluded when `self` is not in it; Timeout as AgreementOptions says;
// InvalidArgument when `self` is not in `current`.
MembershipView agree_next_view(Store& store, const MembershipView& current, int self,
                               const std::vector<int>& lost, const AgreementOptions& options = {});

// ---- shrink (shaped as ncclCommRevoke + ncclCommShrink) ----------------------

struct ShrinkOptions {
  // The job's rendezvous store (the agreement's and the new rendezvous').
  std::shared_ptr<Store> store;
  // This process's rank (a member of the current view) and the process ranks
  // it reports lost (PeerLost::peer() mapped through the view, or none).
  int self = -1;
  std::vector<int> lost;
  AgreementOptions agreement;
  // Bounds the new communicator's creation (rendezvous and handshake).
  std::chrono::milliseconds create_timeout{10000};
  // Rendezvous keys of the new communicator: job `job`, generation = epoch.
  std::string job = "relaxcc-shrink";
  Tunables tunables = Tunables::from_env();
  bool share_memory = true;
  std::string net_devices = "auto";
};

struct ShrinkResult {
  MembershipView view;
  CommunicatorPtr comm;
};

// Collective over the survivors of `current` (comm's view). Poisons `comm`
// first, so that its operations in flight and later fail (revoke), runs
// agree_next_view, then creates a UCX communicator over the view decided
// (rank = position in view.members) with the epoch as its endpoint set's tag
// generation and a fresh worker: no message of `comm` matches one of the new
// communicator. Throws Excluded when this process was left out; Timeout when
// no view is decided, or when a member of the decided view does not arrive
// for the new communicator (it failed after the decision: call shrink again
// on the view returned by Excluded::view() / the decided view with it
// reported lost); Unsupported without the UCX wing.
ShrinkResult shrink(Communicator& comm, const MembershipView& current,
                    const ShrinkOptions& options);

}  // namespace relaxcc
