// join and grow (membership.h): newcomers take tickets in the store, the
// members of the running view decide which tickets the next view admits,
// claim each one (a newcomer that withdrew is left out by everyone alike) and
// create the new view's communicator with the newcomers (protocol and failure
// cases: docs/architecture.md, "Join").
#include <algorithm>
#include <array>
#include <charconv>
#include <string>
#include <vector>

#include "relaxcc/errors.h"
#include "relaxcc/logging.h"
#include "relaxcc/membership.h"
#include "relaxcc/store.h"
#include "src/membership/view_records.h"

namespace relaxcc {

namespace {

using std::chrono::milliseconds;

// The join keys of a job: <prefix>/join/<name>.
std::string join_key(const ViewChangeOptions& o, const std::string& name) {
  return o.agreement.key_prefix + "/join/" + name;
}

// An integer under `key` (decimal text; a missing key reads 0).
int64_t read_count(Store& store, const std::string& key) {
  return store.add(key, 0);
}

std::vector<uint8_t> bytes_of(const std::string& text) {
  return {text.begin(), text.end()};
}

const std::vector<uint8_t> kWithdrawn = bytes_of("withdrawn");

// A grow decision: tickets first..last (none when last < first) and the
// highest process rank used before them; the newcomer of ticket t gets
// process rank highest + 1 + (t - first).
struct Decision {
  int64_t first = 1;
  int64_t last = 0;
  int64_t highest = 0;
};

std::vector<uint8_t> encode(const Decision& d) {
  return bytes_of(detail::concat(d.first, ',', d.last, ',', d.highest));
}

Decision decode_decision(const std::vector<uint8_t>& bytes, const std::string& key) {
  const std::string text(bytes.begin(), bytes.end());
  Decision d;
  const char* p = text.data();
  const char* end = p + text.size();
  bool ok = true;
  for (int64_t* field : {&d.first, &d.last, &d.highest}) {
    const auto r = std::from_chars(p, end, *field);
    ok = ok && r.ec == std::errc();
    p = r.ptr;
    if (field != &d.highest) {
      ok = ok && p != end && *p == ',';
      if (p != end) ++p;
    }
  }
  RELAXCC_ENFORCE(ok && p == end && d.first >= 1 && d.last >= d.first - 1 && d.highest >= 0,
                  CorruptPayload, "grow decision '", text, "' under key ", key,
                  " is not <first ticket>,<last ticket>,<highest process rank>");
  return d;
}

int rank_of_ticket(const Decision& d, int64_t ticket) {
  return static_cast<int>(d.highest + 1 + (ticket - d.first));
}

// Where the next grow starts: the last ticket decided on and the highest
// process rank used, one record (join/next: "<taken>,<highest>"), so that a
// reader never mixes two grows' values.
struct Next {
  int64_t taken = 0;
  int64_t highest = 0;
};

Next read_next(Store& store, const ViewChangeOptions& o) {
  const std::string key = join_key(o, "next");
  if (!store.check({key})) return {};
  const std::vector<uint8_t> bytes = store.get(key);
  const std::string text(bytes.begin(), bytes.end());
  Next n;
  const char* end = text.data() + text.size();
  auto r = std::from_chars(text.data(), end, n.taken);
  bool ok = r.ec == std::errc() && r.ptr != end && *r.ptr == ',';
  if (ok) {
    r = std::from_chars(r.ptr + 1, end, n.highest);
    ok = r.ec == std::errc() && r.ptr == end;
  }
  RELAXCC_ENFORCE(ok && n.taken >= 0 && n.highest >= 0, CorruptPayload, "join record '", text,
                  "' under key ", key, " is not <last ticket taken>,<highest process rank>");
  return n;
}

// What a newcomer reads under admitted/<t>: "<rank>\n<outcome key>\n<view>".
std::vector<uint8_t> encode_admission(int process_rank, const std::string& outcome_key,
                                      const MembershipView& view) {
  const std::vector<uint8_t> record = membership::encode(view);
  return bytes_of(std::to_string(process_rank) + '\n' + outcome_key + '\n' +
                  std::string(record.begin(), record.end()));
}

struct Admission {
  int rank = -1;
  std::string outcome_key;
  MembershipView view;
};

Admission decode_admission(const std::vector<uint8_t>& bytes, const std::string& key) {
  const std::string text(bytes.begin(), bytes.end());
  Admission a;
  const size_t first = text.find('\n');
  const size_t second = first == std::string::npos ? first : text.find('\n', first + 1);
  const auto r = std::from_chars(text.data(), text.data() + std::min(first, text.size()), a.rank);
  RELAXCC_ENFORCE(second != std::string::npos && r.ec == std::errc() &&
                      r.ptr == text.data() + first && second > first + 1,
                  CorruptPayload, "admission record '", text, "' under key ", key,
                  " is not <process rank>, <outcome key>, <view> on three lines");
  a.outcome_key = text.substr(first + 1, second - first - 1);
  a.view = membership::decode(
      std::vector<uint8_t>(bytes.begin() + static_cast<std::ptrdiff_t>(second + 1), bytes.end()),
      key);
  RELAXCC_ENFORCE(a.view.contains(a.rank), CorruptPayload, "admission record '", text,
                  "' under key ", key, ": process ", a.rank, " is not in the view");
  return a;
}

const std::vector<uint8_t> kCreated = bytes_of("created");
const std::vector<uint8_t> kFailed = bytes_of("failed");

// The admission's outcome, all or nothing: the first member or newcomer to
// finish its creation stores whether it succeeded, and every other one
// follows that record. Returns the record.
bool admission_created(Store& store, const std::string& outcome_key, bool created) {
  return store.compare_set(outcome_key, {}, created ? kCreated : kFailed) == kCreated;
}

void check_options(const ViewChangeOptions& o, const char* call) {
  RELAXCC_ENFORCE(o.store != nullptr, InvalidArgument, call, ": ViewChangeOptions::store is null");
  RELAXCC_ENFORCE(!o.agreement.key_prefix.empty(), InvalidArgument, call,
                  ": AgreementOptions::key_prefix is empty");
  RELAXCC_ENFORCE(o.create_timeout > milliseconds(0), InvalidArgument, call,
                  ": ViewChangeOptions::create_timeout must be positive, not ",
                  o.create_timeout.count(), " ms");
}

}  // namespace

int64_t pending_joiners(const ViewChangeOptions& options) {
  check_options(options, "pending_joiners");
  Store& store = *options.store;
  const int64_t taken = read_next(store, options).taken;
  return read_count(store, join_key(options, "tickets")) - taken;
}

ViewChangeResult grow(Communicator& comm, const MembershipView& current,
                      const ViewChangeOptions& options) {
  check_options(options, "grow");
  RELAXCC_ENFORCE_EQ(comm.size(), current.size(), InvalidArgument, "grow of ", current.describe(),
                     ": the communicator's size differs from the view's");
  Store& store = *options.store;
  const int self = current.members[comm.rank()];
  const uint64_t epoch = current.epoch + 1;

  // 1. Decide: rank 0 reads the tickets taken since the last decision and
  // broadcasts them, so that every member proposes the same (no member
  // reads the store after another wrote this grow's records); the first
  // proposal stored is the decision. The key names the first ticket, so
  // that a grow that admitted nobody leaves the view as it was and the next
  // grow on it decides anew.
  auto proposal = std::make_shared<std::array<int64_t, 3>>();
  if (comm.rank() == 0) {
    const Next next = read_next(store, options);
    *proposal = {next.taken + 1, read_count(store, join_key(options, "tickets")),
                 std::max<int64_t>(next.highest, current.members.back())};
  }
  BroadcastOptions b;
  b.label = detail::concat("grow of ", current.describe(), ": the tickets to decide on");
  comm.broadcast(TensorView::host(proposal->data(), 3, proposal), ExecContext::host(), b)
      ->wait(options.create_timeout);
  const Decision candidate{(*proposal)[0], (*proposal)[1], (*proposal)[2]};
  const std::string decision_key =
      detail::concat(options.agreement.key_prefix, '/', current.fingerprint(), "/epoch", epoch,
                     "/grow", candidate.first);
  const Decision d =
      decode_decision(store.compare_set(decision_key, {}, encode(candidate)), decision_key);

  // 2. Claim each ticket decided on, with a value of this decision: a
  // newcomer that withdrew first is left out (and so would be a ticket that
  // another decision claimed); the results are final, so every member
  // leaves out the same ones.
  const std::vector<uint8_t> claim = bytes_of("claimed by " + decision_key);
  MembershipView view{epoch, current.members};
  std::vector<int64_t> admitted;
  for (int64_t t = d.first; t <= d.last; ++t) {
    if (store.compare_set(join_key(options, detail::concat("ticket/", t)), {}, claim) != claim)
      continue;
    admitted.push_back(t);
    view.members.push_back(rank_of_ticket(d, t));
  }
  // Later grows start after these tickets and ranks (every member stores the
  // same record).
  store.set(join_key(options, "next"),
            bytes_of(detail::concat(std::max(d.last, d.first - 1), ',',
                                    d.highest + std::max<int64_t>(d.last - d.first + 1, 0))));
  if (admitted.empty()) return ViewChangeResult{current, nullptr};

  // 3. Tell each newcomer its view and process rank, then create the view's
  // communicator with them. All or nothing: the first creation to end
  // decides (admission_created); a member whose creation failed where that
  // one succeeded is out of the view.
  const std::string outcome_key = decision_key + "/outcome";
  for (int64_t t : admitted)
    store.set(join_key(options, detail::concat("admitted/", t)),
              encode_admission(rank_of_ticket(d, t), outcome_key, view));
  CommunicatorPtr created;
  std::string failure;
  try {
    created = membership::create_view_communicator(view, self, options);
  } catch (const CommunicationError& e) {
    failure = e.what();
  }
  const bool all_created = admission_created(store, outcome_key, created != nullptr);
  if (all_created && created) return ViewChangeResult{view, std::move(created)};
  if (all_created)
    throw Excluded(self, view,
                   detail::concat("grow of ", current.describe(), ": process ", self,
                                  " could not create the communicator of ", view.describe(),
                                  " that the others created (", failure, "); it must rejoin"),
                   __FILE__, __LINE__);
  if (failure.empty()) failure = "another member's or newcomer's creation failed";
  RELAXCC_LOG(warn, "grow of ", current.describe(), ": the communicator of ", view.describe(),
              " was not created (", failure, "); the members go on without the newcomers");
  return ViewChangeResult{current, nullptr};
}

ViewChangeResult join(const ViewChangeOptions& options, milliseconds wait) {
  check_options(options, "join");
  RELAXCC_ENFORCE(wait >= milliseconds(0), InvalidArgument,
                  "join: the wait must not be negative, not ", wait.count(), " ms");
  Store& store = *options.store;
  const int64_t ticket = store.add(join_key(options, "tickets"), 1);
  const std::string admitted_key = join_key(options, detail::concat("admitted/", ticket));
  std::vector<uint8_t> record;
  try {
    record = store.get(admitted_key, wait);
  } catch (const Timeout&) {
    // Withdraw, unless a grow claimed the ticket meanwhile: then its members
    // count on this process, which goes on.
    const std::string ticket_key = join_key(options, detail::concat("ticket/", ticket));
    if (store.compare_set(ticket_key, {}, kWithdrawn) == kWithdrawn)
      RELAXCC_THROW(Timeout, "join: ticket ", ticket, " under ", options.agreement.key_prefix,
                    " was not admitted within ", wait.count(),
                    " ms (no member of a running job reached a point where it admits newcomers, "
                    "such as an elastic Reducer's step boundary); the ticket is withdrawn");
    record = store.get(admitted_key, options.create_timeout);
  }
  const Admission a = decode_admission(record, admitted_key);
  CommunicatorPtr created;
  try {
    created = membership::create_view_communicator(a.view, a.rank, options);
  } catch (const CommunicationError& e) {
    admission_created(store, a.outcome_key, false);
    throw;
  }
  RELAXCC_ENFORCE(admission_created(store, a.outcome_key, true), CommunicationError,
                  "join: ticket ", ticket, " was admitted to ", a.view.describe(), " as process ",
                  a.rank, ", but another creation of that view's communicator failed; join again");
  return ViewChangeResult{a.view, std::move(created)};
}

}  // namespace relaxcc
