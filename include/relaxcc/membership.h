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
//
// shrink, grow and join change views (a new UCX communicator per view);
// sync_state gives newcomers the training state; ElasticOptions is what an
// elastic Reducer (reducer.h) needs to do all of it by itself.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
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

// How a view changes (shrink, grow, join): the store, the keys and the new
// view's UCX communicator. Members and newcomers of one job pass the same
// store, agreement.key_prefix and job.
struct ViewChangeOptions {
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

struct ViewChangeResult {
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
// ViewChangeOptions::timeout has passed: Timeout naming the last view decided
// and the creation's error. Throws Excluded when this process was left out
// of a view (it must rejoin); InvalidArgument when comm and current differ
// in size or a lost rank is not a peer's rank of comm; PeerMismatch as
// agree_next_view; Unsupported without the UCX wing.
ViewChangeResult shrink(Communicator& comm, const MembershipView& current,
                        const ViewChangeOptions& options);

// ---- join and grow (shaped as ncclCommGrow) -------------------------------------
//
// A newcomer takes a ticket in the store and waits (join); the members of the
// running view, at a point where all of them agreed to admit (a step
// boundary: the elastic Reducer's commit), call grow together. The first
// member to decide stores the next view: the current members and every
// ticket taken by then, each newcomer getting the next process rank never
// used in the job. Each admitted ticket is claimed in the store before the
// newcomer is told its view; a newcomer that gave up first (its wait ran
// out: it withdrew its ticket) is left out of the view by every member
// alike. Then members and newcomers create the new view's UCX communicator.
// Keys: <agreement.key_prefix>/join/{tickets, next, ticket/<t>,
// admitted/<t>} and <agreement.key_prefix>/<fingerprint>/epoch<E>/grow<t>.
// Protocol and failure cases: docs/architecture.md, "Join".

// How many newcomers wait for admission in options.store (tickets taken and
// not yet decided on). Two or three store calls; local, not collective: one
// member reads it and tells the others (a grow changes what it reads).
int64_t pending_joiners(const ViewChangeOptions& options);

// Collective over the members of `current`, the view `comm` runs on (comm
// rank r is process current.members[r]), each calling it at the same point
// of its run. Returns the next view (epoch current.epoch + 1: the members
// and the newcomers admitted, ascending) and its communicator (rank = the
// position in view.members); comm itself stays usable until the caller drops
// it. All or nothing: the first member or newcomer whose creation of that
// communicator ended stores whether it succeeded, and everyone follows it.
// When no newcomer was admitted (none waited, every one withdrew, or the
// creation failed: a newcomer that never came, a member lost meanwhile), the
// view is `current` and comm is null: the caller keeps comm (a lost member
// then fails its next operation, as always). Rank 0 of comm reads the store
// and broadcasts the tickets to decide on over comm: a failure of comm
// there is a CommunicationError (and that broadcast's Timeout after
// options.create_timeout). Throws Excluded when this member's creation failed
// where the others' succeeded (it must rejoin); InvalidArgument when comm and current differ in
// size or the options are out of range; CorruptPayload for a record in the store that is not
// grow's; Unsupported without the UCX wing; the store's errors.
ViewChangeResult grow(Communicator& comm, const MembershipView& current,
                      const ViewChangeOptions& options);

// A newcomer: takes a ticket and waits up to `wait` for the members to admit
// it (grow), then creates its communicator with them. Returns the view that
// admitted it, with this process's new process rank in it
// (view.members[comm->rank()]), and the communicator. Throws Timeout when no
// grow admitted it within `wait` (its ticket is withdrawn: no later grow
// counts on it), or Timeout from the store when a grow claimed the ticket
// but its record never came; CommunicationError when the admission's creation failed
// (here or, first, elsewhere: then the members went on without it), after
// which it may join again; InvalidArgument for options out of range.
ViewChangeResult join(const ViewChangeOptions& options, std::chrono::milliseconds wait);

// ---- State transfer ---------------------------------------------------------

struct StateSyncOptions {
  // Bounds each of the transfer's collectives.
  std::chrono::milliseconds timeout{60000};
  // Names the collectives in errors and traces.
  std::string label = "state sync";
};

struct StateSyncResult {
  // The agreed state: a holder's own, or what it received.
  std::vector<uint8_t> state;
  // Its FNV-1a hash (hash.h), which every rank checked.
  uint64_t hash = 0;
  // Ranks of the communicator that sent a share (ascending) and that received
  // the state (newcomers and holders whose state differed).
  std::vector<int> sources;
  std::vector<int> receivers;
};

// Collective over `comm`: makes every rank hold the same training state, as
// PCCL does. A rank that holds a state passes it (`state`, with `holds`
// true); a newcomer passes holds false. The ranks exchange (hash, size); the
// pair held by the most holders (of a tie, the one the lowest rank holds)
// is the agreed state, and the holders that hold it are the sources. Every
// other rank (a newcomer, or a holder whose state differs: it is resynced,
// with a warning naming it) receives the state in shares, one contiguous
// share from each source at once (one alltoallv), and checks the hash of
// what it assembled; all ranks then learn every receiver's check. Errors, on
// every rank alike: InvalidArgument when no rank holds a state; CorruptPayload
// naming the receivers whose assembled state fails the hash; what the
// collectives throw (PeerLost, Timeout after options.timeout).
StateSyncResult sync_state(Communicator& comm, const std::vector<uint8_t>& state, bool holds,
                           const StateSyncOptions& options = {});

// ---- Elastic training ----------------------------------------------------------

// What a Reducer needs to go on without lost members (ReducerOptions::elastic,
// reducer.h): the view its communicator runs on and how to shrink it.
struct ElasticOptions {
  // Communicator rank r is process view.members[r].
  MembershipView view;
  // The store, timeouts and UCX settings of each shrink; lost_ranks is
  // filled in from the rank that the poisoned communicator names lost.
  // view_change.agreement.timeout must exceed a step's compute time: a survivor
  // joins the agreement when it reaches synchronize().
  ViewChangeOptions view_change;
  // Views changed within one iteration before the Reducer gives up and
  // rethrows the step's PeerLost.
  int max_view_changes_per_iteration = 3;

  // Admit newcomers (join()) at step boundaries. Rank 0 looks for waiting
  // newcomers in the store at most every admission_interval; its finding
  // rides on the iteration's commit, and at the end of that step's
  // optimizer_step() the members grow the view and hand the newcomers the
  // plan and the training state (sync_state: save_state()'s bytes, the
  // algorithm's replicated state, the step).
  bool admit = false;
  std::chrono::milliseconds admission_interval{100};
  // The application's part of the training state (model, optimizer state,
  // data position, RNG positions), as torchft's Manager takes it: save_state
  // on the members at the step boundary, load_state on a newcomer (and on a
  // member whose state differed from the others'). Needed with admit or
  // newcomer; save_state must give the same bytes on every member.
  std::function<std::vector<uint8_t>()> save_state;
  std::function<void(const std::vector<uint8_t>&)> load_state;
  // This process is a newcomer: view and the Reducer's communicator come
  // from join(), and the Reducer's construction is its half of the
  // admission (the members' optimizer_step() runs the other): no
  // construction agreement; it receives rank 0's plan, verifies it
  // (PeerMismatch) and loads the state.
  bool newcomer = false;
};

}  // namespace relaxcc
