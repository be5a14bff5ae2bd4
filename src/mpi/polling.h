// How an engine's threads wait for the network: whether this rank shares its
// CPUs with other ranks of its node, and whether MPI's own progress yields.
//
// CPU sharing is detected from two sources: the affinity masks of the node's
// ranks (exchanged in the communicator's handshake), where more ranks overlap
// this rank's mask than the CPUs those masks span; and a cgroup CPU quota
// (cgroup v2 cpu.max, v1 cpu.cfs_quota_us), where the node's ranks outnumber
// the CPUs it grants.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "engine.h"

namespace relaxcc::mpi {

// An affinity mask: CPUs 0..1023, 64 to a word.
using CpuMask = std::array<uint64_t, 16>;

// This process's affinity mask (every CPU when it cannot be read).
CpuMask own_cpu_mask();

// The CPUs this process's cgroup grants per period (quota / period), or 0
// when no quota applies.
double cgroup_cpu_limit();

// Whether rank `me` of a node shares CPUs with other ranks: `masks` holds the
// affinity masks of the node's ranks (me among them), `cpu_limit` the
// cgroup's CPUs (0: none).
bool shares_cpus(const std::vector<CpuMask>& masks, size_t me, double cpu_limit);

// Whether MPI's progress engine calls sched_yield when a poll finds nothing
// (Open MPI's mpi_yield_when_idle, which mpirun sets for oversubscribed
// runs), read through the MPI tool interface; false when it has no such
// variable.
bool mpi_yields_when_idle();

// RELAXCC_ENGINE_POLL ("auto", "sleep" or "yield"; InvalidArgument
// otherwise): auto waits as for shared CPUs when `shared`.
Engine::Polling choose_polling(const std::string& policy, bool shared);

}  // namespace relaxcc::mpi
