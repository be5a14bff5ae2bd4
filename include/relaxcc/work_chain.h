// Runs operations one after another as one Work: each stage starts once the
// Work of the previous stage completed (a stage may return null: nothing to
// wait for). A helper thread walks the chain, waiting on each stage with
// `stage_timeout`; the first failure ends the chain and becomes the chain's
// exception. For hierarchical schemes (reduce in the node, across leaders,
// back down) that must not block the caller.
#pragma once

#include <chrono>
#include <functional>
#include <vector>

#include "relaxcc/work.h"

namespace relaxcc {

WorkPtr chain_works(std::vector<std::function<WorkPtr()>> stages, std::chrono::milliseconds stage_timeout,
                    std::string description);

}  // namespace relaxcc
