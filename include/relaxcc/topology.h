// Node layout and hierarchical communicators.
//
// The layout comes from the transport (ranks that share memory, found with
// MPI_Comm_split_type on MPI) and hwloc (what the node has). Setting
// RELAXCC_RANKS_PER_NODE=N overrides it: ranks [k*N, (k+1)*N) form node k, so
// hierarchical code runs and is tested on one machine (4 ranks as 2 x 2).
#pragma once

#include <string>

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
// divide the communicator size.
HierarchicalComms build_hierarchy(Communicator& comm, const Tunables& tunables);

// hwloc's summary of the machine this process runs on.
std::string describe_hardware();

}  // namespace relaxcc
