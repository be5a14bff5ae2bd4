// shrink (membership.h): revoke the old communicator, agree on the next view,
// create the new view's communicator on the UCX wing, agreeing again when a
// member of the decided view fails before that communicator exists.
#include <chrono>
#include <string>
#include <vector>

#include "relaxcc/errors.h"
#include "relaxcc/membership.h"
#include "src/membership/view_records.h"

namespace relaxcc {

ViewChangeResult shrink(Communicator& comm, const MembershipView& current,
                        const ViewChangeOptions& options) {
  RELAXCC_ENFORCE(options.store != nullptr, InvalidArgument, "shrink of ", current.describe(),
                  ": ViewChangeOptions::store is null");
  RELAXCC_ENFORCE_EQ(comm.size(), current.size(), InvalidArgument, "shrink of ", current.describe(),
                     ": the communicator's size differs from the view's");
  const int self = current.members[comm.rank()];
  std::vector<int> lost;
  for (int r : options.lost_ranks) {
    RELAXCC_ENFORCE(r >= 0 && r < comm.size() && r != comm.rank(), InvalidArgument, "shrink of ",
                    current.describe(), ": rank ", comm.rank(), " reports rank ", r,
                    " lost, which is not a peer's rank of its communicator of size ", comm.size());
    lost.push_back(current.members[r]);
  }
  comm.poison(detail::concat("revoked: shrinking ", current.describe()));
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  MembershipView view = current;
  for (;;) {
    view = agree_next_view(*options.store, view, self, lost, options.agreement);
    // A member of `view` that fails before its communicator exists is left
    // out by the next agreement, at its timeout.
    lost.clear();
    try {
      return ViewChangeResult{view, membership::create_view_communicator(view, self, options)};
    } catch (const PeerMismatch&) {
      throw;
    } catch (const CommunicationError& e) {
      // A member of `view` failed after the decision: agree again from it,
      // with the member the creation named lost (a rank of `view`) as this
      // process's evidence.
      const auto* named = dynamic_cast<const PeerLost*>(&e);
      if (named != nullptr && named->peer() >= 0 && named->peer() < view.size() &&
          view.members[named->peer()] != self)
        lost.push_back(view.members[named->peer()]);
      RELAXCC_ENFORCE(std::chrono::steady_clock::now() < deadline, Timeout, "shrink of ",
                      current.describe(), ": the communicator of ", view.describe(),
                      " was not created (", e.what(), ") and ViewChangeOptions::timeout of ",
                      options.timeout.count(), " ms has passed");
    }
  }
}

}  // namespace relaxcc
