// The membership calls' shared records and view communicators
// (view_records.h).
#include "src/membership/view_records.h"

#include <charconv>

#include "relaxcc/errors.h"
#include "relaxcc/ucx_communicator.h"

namespace relaxcc::membership {

std::string joined(const std::vector<int>& members) {
  std::string out;
  for (size_t i = 0; i < members.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(members[i]);
  }
  return out;
}

std::vector<uint8_t> encode(const MembershipView& view) {
  const std::string text = std::to_string(view.epoch) + ':' + joined(view.members);
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

CommunicatorPtr create_view_communicator(const MembershipView& view, int self,
                                         const ViewChangeOptions& options) {
  UcxCommunicatorOptions o;
  o.store = options.store;
  o.rendezvous.rank = view.rank_of(self);
  o.rendezvous.size = view.size();
  o.rendezvous.job = detail::concat(options.job, '/', view.fingerprint());
  o.rendezvous.generation = view.epoch;
  o.tunables = options.tunables;
  o.timeout = options.create_timeout;
  o.share_memory = options.share_memory;
  o.net_devices = options.net_devices;
  return create_ucx_communicator(o);
}

}  // namespace relaxcc::membership
