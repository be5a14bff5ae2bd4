// agree_next_view: the store-based agreement on the next membership view
// (protocol and failure cases: docs/architecture.md, "Membership agreement").
#include <algorithm>
#include <charconv>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "relaxcc/membership.h"
#include "relaxcc/store.h"
#include "src/membership/view_records.h"

namespace relaxcc {

using membership::decode;
using membership::encode;
using membership::joined;

int MembershipView::rank_of(int process_rank) const {
  const auto it = std::lower_bound(members.begin(), members.end(), process_rank);
  if (it == members.end() || *it != process_rank) return -1;
  return static_cast<int>(it - members.begin());
}

std::string MembershipView::describe() const {
  return "epoch " + std::to_string(epoch) + " {" + joined(members) + '}';
}

uint64_t MembershipView::fingerprint() const {
  Fnv1a h;
  h.u64(epoch).u64(members.size());
  for (int m : members) h.u64(static_cast<uint64_t>(m));
  return h.value();
}

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A record read under the keys of `current`'s agreement must be one of it:
// epoch current.epoch + 1, members (or accused members) of `current`.
MembershipView checked(MembershipView record, const MembershipView& current, const std::string& key,
                       const char* what) {
  std::vector<int> strangers;
  std::set_difference(record.members.begin(), record.members.end(), current.members.begin(),
                      current.members.end(), std::back_inserter(strangers));
  RELAXCC_ENFORCE(record.epoch == current.epoch + 1 && strangers.empty(), PeerMismatch, what,
                  " under key ", key, " is ", record.describe(), ", not one of membership view ",
                  current.describe(), ": ",
                  record.epoch != current.epoch + 1
                      ? detail::concat("epoch ", record.epoch, " instead of ", current.epoch + 1)
                      : detail::concat("members {", joined(strangers), "} are not in the view"));
  return record;
}

MembershipView adopt(MembershipView decided, int self) {
  if (!decided.contains(self)) {
    std::string message = "process " + std::to_string(self) + " was left out of membership view " +
                          decided.describe() +
                          " (its peers reported it lost, it reported lost a member they hear "
                          "from, or it came after the decision); it must rejoin";
    throw Excluded(self, std::move(decided), std::move(message), __FILE__, __LINE__);
  }
  return decided;
}

// Proposals read: proposer -> the members it reports lost.
using Proposals = std::map<int, std::vector<int>>;

// How many proposers of `heard` other than `member` report it lost.
int accusers(const Proposals& heard, int member) {
  int n = 0;
  for (const auto& [proposer, accused] : heard) {
    if (proposer != member && std::binary_search(accused.begin(), accused.end(), member)) ++n;
  }
  return n;
}

// Whether a strict majority of the proposers in `heard` other than `member`
// report `member` lost.
bool condemned(const Proposals& heard, int member) {
  const int others = static_cast<int>(heard.size()) - (heard.count(member) ? 1 : 0);
  return 2 * accusers(heard, member) > others;
}

// The view decided from the proposals read: the proposers, less those a
// strict majority of the other proposers report lost; then, while a member
// left reports another member left lost (a minority accuser), the highest
// such accuser is left out too: no member of the view reports another lost,
// and of two that report each other only the higher goes.
std::vector<int> decide(const Proposals& heard) {
  std::vector<int> stay;
  for (const auto& entry : heard) {
    if (!condemned(heard, entry.first)) stay.push_back(entry.first);
  }
  const auto accuses_a_member = [&](int m) {
    const std::vector<int>& accused = heard.at(m);
    return std::any_of(accused.begin(), accused.end(),
                       [&](int a) { return std::binary_search(stay.begin(), stay.end(), a); });
  };
  for (;;) {
    const auto accuser = std::find_if(stay.rbegin(), stay.rend(), accuses_a_member);
    if (accuser == stay.rend()) return stay;
    stay.erase(std::next(accuser).base());
  }
}

// Whether the caller may decide before its deadline: every member not heard
// from is reported lost by a strict majority of the other members of
// `current` (so one accuser alone never cuts a wait short, unless the view
// has two members).
bool may_decide(const Proposals& heard, const MembershipView& current) {
  return std::all_of(current.members.begin(), current.members.end(), [&](int m) {
    return heard.count(m) > 0 || 2 * accusers(heard, m) > current.size() - 1;
  });
}

constexpr milliseconds kPoll{2};

}  // namespace

MembershipView agree_next_view(Store& store, const MembershipView& current, int self,
                               const std::vector<int>& lost, const AgreementOptions& options) {
  RELAXCC_ENFORCE(current.contains(self), InvalidArgument, "process ", self,
                  " is not a member of membership view ", current.describe());
  RELAXCC_ENFORCE(!options.key_prefix.empty(), InvalidArgument,
                  "AgreementOptions::key_prefix is empty");
  RELAXCC_ENFORCE(options.timeout > milliseconds(0), InvalidArgument,
                  "AgreementOptions::timeout must be positive, not ", options.timeout.count(),
                  " ms");
  std::vector<int> accused;
  for (int m : lost) {
    RELAXCC_ENFORCE(current.contains(m), InvalidArgument, "process ", self, " reports process ", m,
                    " lost, which is not a member of membership view ", current.describe());
    if (m != self) accused.push_back(m);
  }
  std::sort(accused.begin(), accused.end());
  accused.erase(std::unique(accused.begin(), accused.end()), accused.end());

  const auto deadline = Clock::now() + options.timeout;
  const uint64_t epoch = current.epoch + 1;
  const std::string base =
      detail::concat(options.key_prefix, '/', current.fingerprint(), "/epoch", epoch, '/');
  const std::string decision_key = base + "decision";
  const std::string count_key = base + "proposals";
  const auto proposal_key = [&](int member) { return base + "proposal/" + std::to_string(member); };
  const auto adopt_stored = [&](const std::vector<uint8_t>& bytes) {
    return adopt(checked(decode(bytes, decision_key), current, decision_key, "the decision"), self);
  };

  // A view already decided (this caller arrives late) is final.
  if (store.check({decision_key})) return adopt_stored(store.get(decision_key));

  // 1. Propose: the members this caller reports lost, on its own evidence.
  store.set(proposal_key(self), encode(MembershipView{epoch, accused}));
  store.add(count_key, 1);

  // 2. Collect proposals until every member not heard from is reported lost
  // by a strict majority of the view's other members (may_decide), or until
  // the deadline; stop when a decision is stored meanwhile.
  Proposals heard{{self, accused}};
  int64_t counted = 0;
  while (!may_decide(heard, current) && Clock::now() < deadline) {
    if (store.check({decision_key})) return adopt_stored(store.get(decision_key));
    const int64_t count = store.add(count_key, 0);
    if (count != counted) {
      counted = count;
      for (int m : current.members) {
        if (heard.count(m) || !store.check({proposal_key(m)})) continue;
        const std::string key = proposal_key(m);
        heard[m] = checked(decode(store.get(key), key), current, key, "the proposal").members;
      }
    } else {
      std::this_thread::sleep_for(kPoll);
    }
  }

  // 3. Decide: the first candidate stored under the decision key is the view;
  // every later compare_set returns it. Everyone ends with the same view.
  const MembershipView candidate{epoch, decide(heard)};
  return adopt_stored(store.compare_set(decision_key, {}, encode(candidate)));
}

}  // namespace relaxcc
