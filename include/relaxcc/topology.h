// Node layout and hierarchical communicators.
//
// The layout comes from the transport (ranks that share memory, found with
// MPI_Comm_split_type on MPI) and hwloc (what the node has). Setting
// RELAXCC_RANKS_PER_NODE=N overrides it: ranks [k*N, (k+1)*N) form node k, so
// hierarchical code runs and is tested on one machine (4 ranks as 2 x 2).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "relaxcc/communicator.h"
#include "relaxcc/tunables.h"

namespace relaxcc {

struct NodeLayout {
  int node = 0;  // this rank's node, 0-based, ordered by lowest rank
  int num_nodes = 1;
  int local_rank = 0;  // rank within the node
  int local_size = 1;
  bool overridden = false;  // from RELAXCC_RANKS_PER_NODE
  std::string hardware;     // hwloc's view of this node: "2 cores, 2 PUs, 1 NUMA node"
};

struct HierarchicalComms {
  NodeLayout layout;
  CommunicatorPtr intra;  // the ranks of this node
  CommunicatorPtr inter;  // node leaders (local_rank 0) only; null elsewhere
};

// Collective over `comm`. Throws InvalidArgument when ranks_per_node does not
// divide the communicator size. The node ids are exchanged as host integers
// over comm.host_communicator() when it has one (a device communicator such
// as NCCL's), otherwise over `comm`; intra and inter are made by `comm`
// (split, split_node_local), so they are of its kind.
HierarchicalComms build_hierarchy(Communicator& comm, const Tunables& tunables);

// hwloc's summary of the machine this process runs on.
std::string describe_hardware();

// CPU sharing between the ranks of a node. A rank shares CPUs when more
// ranks overlap its affinity mask than the CPUs their masks span, or when the
// node's ranks outnumber the CPUs a cgroup quota grants. Engines then poll
// the network politely (RELAXCC_ENGINE_POLL=auto).

// An affinity mask: CPUs 0..1023, 64 to a word.
using CpuMask = std::array<uint64_t, 16>;

// This process's affinity mask (every CPU when it cannot be read).
CpuMask own_cpu_mask();

// The CPUs per period that this process's cgroup grants (cgroup v2 cpu.max,
// v1 cpu.cfs_quota_us over cpu.cfs_period_us), or 0 when no quota applies.
// `proc_cgroup` and `root` locate /proc/self/cgroup and the cgroup file
// system.
double cgroup_cpu_limit(const std::string& proc_cgroup = "/proc/self/cgroup",
                        const std::string& root = "/sys/fs/cgroup");

// Whether rank `me` of a node shares CPUs: `masks` holds the affinity masks
// of the node's ranks (me among them), `cpu_limit` the cgroup's CPUs (0:
// none). InvalidArgument when `me` is not an index of `masks`.
bool shares_cpus(const std::vector<CpuMask>& masks, size_t me, double cpu_limit);

}  // namespace relaxcc
