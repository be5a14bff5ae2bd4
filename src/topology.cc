#include "relaxcc/topology.h"

#include <hwloc.h>

#include <algorithm>
#include <vector>

#include "relaxcc/errors.h"
#include "relaxcc/logging.h"

namespace relaxcc {

std::string describe_hardware() {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0) return "unknown (hwloc_topology_init failed)";
  std::string out = "unknown (hwloc_topology_load failed)";
  if (hwloc_topology_load(topo) == 0) {
    const int cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    const int pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
    const int numa = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    const int packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
    out = detail::concat(packages, " package(s), ", cores, " cores, ", pus, " PUs, ", numa,
                         " NUMA node(s)");
  }
  hwloc_topology_destroy(topo);
  return out;
}

HierarchicalComms build_hierarchy(Communicator& comm, const Tunables& tunables) {
  HierarchicalComms h;
  NodeLayout& layout = h.layout;
  const int rank = comm.rank(), size = comm.size();
  layout.hardware = describe_hardware();
  if (tunables.ranks_per_node > 0) {
    const int per_node = static_cast<int>(tunables.ranks_per_node);
    RELAXCC_ENFORCE(size % per_node == 0, InvalidArgument, "RELAXCC_RANKS_PER_NODE=", per_node,
                    " does not divide the communicator size ", size);
    layout.overridden = true;
    layout.node = rank / per_node;
    layout.num_nodes = size / per_node;
    layout.local_rank = rank % per_node;
    layout.local_size = per_node;
    h.intra = comm.split(layout.node, rank);
  } else {
    h.intra = comm.split_node_local();
    layout.local_rank = h.intra->rank();
    layout.local_size = h.intra->size();
    // Node ids: nodes ordered by their leader's rank in `comm`.
    // Owned by their views: a timed-out collective's parked requests never
    // touch freed memory.
    auto leader = std::make_shared<int32_t>(rank);
    h.intra->broadcast(TensorView::host(leader.get(), 1, leader), ExecContext::host(), {})->wait();
    auto leaders_buf = std::make_shared<std::vector<int32_t>>(size);
    const std::vector<int32_t>& leaders = *leaders_buf;
    comm.allgather(TensorView::host(leader.get(), 1, leader),
                   TensorView::host(leaders_buf->data(), size, leaders_buf), ExecContext::host())
        ->wait();
    std::vector<int32_t> distinct = leaders;
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    layout.num_nodes = static_cast<int>(distinct.size());
    layout.node = static_cast<int>(std::lower_bound(distinct.begin(), distinct.end(), *leader) -
                                   distinct.begin());
  }
  h.inter = comm.split(layout.local_rank == 0 ? 0 : -1, rank);
  RELAXCC_LOG(info, "node layout: node ", layout.node, "/", layout.num_nodes, ", local rank ",
              layout.local_rank, "/", layout.local_size,
              layout.overridden ? " (RELAXCC_RANKS_PER_NODE)" : "",
              "; hardware: ", layout.hardware);
  return h;
}

}  // namespace relaxcc
