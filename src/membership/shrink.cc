// shrink (membership.h): revoke the old communicator, agree on the next view,
// create the new view's communicator on the UCX wing.
#include "relaxcc/errors.h"
#include "relaxcc/membership.h"
#include "relaxcc/ucx_communicator.h"

namespace relaxcc {

ShrinkResult shrink(Communicator& comm, const MembershipView& current,
                    const ShrinkOptions& options) {
  RELAXCC_ENFORCE(options.store != nullptr, InvalidArgument, "shrink of ", current.describe(),
                  ": ShrinkOptions::store is null");
  RELAXCC_ENFORCE_EQ(comm.size(), current.size(), InvalidArgument, "shrink of ", current.describe(),
                     ": the communicator's size differs from the view's");
  comm.poison(detail::concat("revoked: shrinking ", current.describe()));
  ShrinkResult result;
  result.view =
      agree_next_view(*options.store, current, options.self, options.lost, options.agreement);
  UcxCommunicatorOptions o;
  o.store = options.store;
  o.rendezvous.rank = result.view.rank_of(options.self);
  o.rendezvous.size = result.view.size();
  o.rendezvous.job = options.job;
  o.rendezvous.generation = result.view.epoch;
  o.tunables = options.tunables;
  o.timeout = options.create_timeout;
  o.share_memory = options.share_memory;
  o.net_devices = options.net_devices;
  result.comm = create_ucx_communicator(o);
  return result;
}

}  // namespace relaxcc
