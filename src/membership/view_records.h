// What the membership calls share: a view's text in the store and the
// creation of a view's UCX communicator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "relaxcc/membership.h"

namespace relaxcc::membership {

// "a,b,c".
std::string joined(const std::vector<int>& members);

// "<epoch>:<m>,<m>,..." (members ascending): a decision (the view) or a
// proposal (the epoch and the members its proposer reports lost).
std::vector<uint8_t> encode(const MembershipView& view);
// CorruptPayload naming `key` for a record that is not encode()'s.
MembershipView decode(const std::vector<uint8_t>& bytes, const std::string& key);

// The UCX communicator of `view` for process `self` (a member): rank = its
// position in view.members, rendezvous job "<options.job>/<fingerprint>",
// generation = the epoch, bounded by options.create_timeout.
CommunicatorPtr create_view_communicator(const MembershipView& view, int self,
                                         const ViewChangeOptions& options);

}  // namespace relaxcc::membership
