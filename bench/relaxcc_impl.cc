#include "bench_util.h"
#include "relaxcc/errors.h"

namespace relaxcc::bench {

NamedAllreduce make_relaxcc_allreduce(const std::string& impl, const std::string&, BenchWorld&) {
  RELAXCC_THROW(InvalidArgument, "unknown --impl '", impl, "': this build has 'mpi'");
}

}  // namespace relaxcc::bench
