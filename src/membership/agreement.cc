// agree_next_view: the store-based agreement on the next membership view
// (protocol and failure cases: docs/architecture.md, "Membership agreement").
#include <algorithm>
#include <charconv>
#include <string>
#include <vector>

#include "relaxcc/errors.h"
#include "relaxcc/membership.h"
#include "relaxcc/store.h"

namespace relaxcc {

int MembershipView::rank_of(int process_rank) const {
  const auto it = std::lower_bound(members.begin(), members.end(), process_rank);
  if (it == members.end() || *it != process_rank) return -1;
  return static_cast<int>(it - members.begin());
}

std::string MembershipView::describe() const {
  std::string out = "epoch " + std::to_string(epoch) + " {";
  for (size_t i = 0; i < members.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(members[i]);
  }
  return out + '}';
}

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// "<epoch>:<m>,<m>,..." (members ascending).
std::vector<uint8_t> encode(const MembershipView& view) {
  std::string text = std::to_string(view.epoch) + ':';
  for (size_t i = 0; i < view.members.size(); ++i) {
    if (i > 0) text += ',';
    text += std::to_string(view.members[i]);
  }
  return {text.begin(), text.end()};
}

MembershipView decode(const std::vector<uint8_t>& bytes, const std::string& key) {
  const std::string text(bytes.begin(), bytes.end());
  MembershipView view;
  const char* p = text.data();
  const char* end = p + text.size();
  auto r = std::from_chars(p, end, view.epoch);
  RELAXCC_ENFORCE(r.ec == std::errc() && r.ptr != end && *r.ptr == ':', CorruptPayload,
                  "membership record '", text, "' under key ", key, " has no epoch");
  p = r.ptr + 1;
  while (p != end) {
    int member = 0;
    r = std::from_chars(p, end, member);
    RELAXCC_ENFORCE(r.ec == std::errc() && member >= 0 &&
                        (view.members.empty() || member > view.members.back()),
                    CorruptPayload, "membership record '", text, "' under key ", key,
                    " has a bad member list");
    view.members.push_back(member);
    p = r.ptr;
    if (p != end) {
      RELAXCC_ENFORCE(*p == ',' && p + 1 != end, CorruptPayload, "membership record '", text,
                      "' under key ", key, " has a bad separator");
      ++p;
    }
  }
  return view;
}

std::vector<int> without(const std::vector<int>& members, const std::vector<int>& lost) {
  std::vector<int> out;
  for (int m : members) {
    if (std::find(lost.begin(), lost.end(), m) == lost.end()) out.push_back(m);
  }
  return out;
}

std::vector<int> intersect(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

MembershipView adopt(MembershipView decided, int self) {
  if (!decided.contains(self)) {
    std::string message = "process " + std::to_string(self) + " was left out of membership view " +
                          decided.describe() + " (its peers reported it lost); it must rejoin";
    throw Excluded(self, std::move(decided), std::move(message), __FILE__, __LINE__);
  }
  return decided;
}

}  // namespace

MembershipView agree_next_view(Store& store, const MembershipView& current, int self,
                               const std::vector<int>& lost, const AgreementOptions& options) {
  RELAXCC_ENFORCE(current.contains(self), InvalidArgument, "process ", self,
                  " is not a member of membership view ", current.describe());
  RELAXCC_ENFORCE(!options.key_prefix.empty(), InvalidArgument,
                  "AgreementOptions::key_prefix is empty");
  const auto start = Clock::now();
  const auto deadline = start + options.timeout;
  const auto proposals_deadline = start + std::min(options.proposal_wait, options.timeout);
  const std::string base = options.key_prefix + "/epoch" + std::to_string(current.epoch + 1) + '/';
  const std::string decision_key = base + "decision";
  const auto proposal_key = [&](int member) { return base + "proposal/" + std::to_string(member); };

  // A view already decided (this caller arrives late) is final.
  if (store.check({decision_key}))
    return adopt(decode(store.get(decision_key), decision_key), self);

  // 1. Propose: the members this caller believes alive.
  std::vector<int> alive = without(current.members, lost);
  if (!std::binary_search(alive.begin(), alive.end(), self)) {
    alive.insert(std::lower_bound(alive.begin(), alive.end(), self), self);
  }
  store.set(proposal_key(self), encode(MembershipView{current.epoch + 1, alive}));

  // 2. Collect the proposals of every member still believed alive; a member
  // whose proposal misses proposals_deadline counts as lost (it failed during
  // the agreement); a member another proposer reports lost is dropped (the
  // candidate is the intersection of the proposals: one report suffices).
  std::vector<int> heard{self};
  for (;;) {
    int next = -1;
    for (int m : alive) {
      if (m != self && std::find(heard.begin(), heard.end(), m) == heard.end()) {
        next = m;
        break;
      }
    }
    if (next < 0) break;
    if (store.check({decision_key})) break;
    const auto now = Clock::now();
    const auto wait = std::max(milliseconds(1),
                               std::chrono::duration_cast<milliseconds>(proposals_deadline - now));
    try {
      const std::string key = proposal_key(next);
      const MembershipView proposal = decode(store.get(key, wait), key);
      heard.push_back(next);
      alive = intersect(alive, proposal.members);
    } catch (const Timeout&) {
      alive.erase(std::find(alive.begin(), alive.end(), next));
    }
  }

  // 3. Decide: the first candidate stored under the decision key is the view;
  // every later compare_set returns it. Everyone ends with the same view.
  RELAXCC_ENFORCE(Clock::now() < deadline, Timeout, "membership agreement on epoch ",
                  current.epoch + 1, " from view ", current.describe(), " ran past its timeout of ",
                  options.timeout.count(), " ms (store ", store.address(), ")");
  const MembershipView candidate{current.epoch + 1, alive};
  const auto stored = store.compare_set(decision_key, {}, encode(candidate));
  return adopt(decode(stored, decision_key), self);
}

}  // namespace relaxcc
