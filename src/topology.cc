#include "relaxcc/topology.h"

#include <hwloc.h>
#include <sched.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <fstream>
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

CpuMask own_cpu_mask() {
  CpuMask out{};
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    out.fill(~uint64_t{0});
    return out;
  }
  for (size_t cpu = 0; cpu < out.size() * 64 && cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) out[cpu / 64] |= uint64_t{1} << (cpu % 64);
  return out;
}

namespace {
// The process's cgroup path for `controller` ("" for cgroup v2's unified
// hierarchy), from `proc_cgroup`'s lines "id:controllers:path".
std::string cgroup_path(const std::string& proc_cgroup, const std::string& controller) {
  std::ifstream in(proc_cgroup);
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const bool match =
        controller.empty()
            ? controllers.empty()
            : ("," + controllers + ",").find("," + controller + ",") != std::string::npos;
    if (match) return line.substr(b + 1);
  }
  return {};
}

// Quota over period from the first readable file pair; 0 when unlimited.
double read_limit(const std::vector<std::string>& dirs, bool v2) {
  for (const std::string& dir : dirs) {
    if (v2) {
      std::ifstream in(dir + "/cpu.max");
      std::string quota;
      double period = 0;
      if (!(in >> quota >> period)) continue;
      char* end = nullptr;
      const double q = std::strtod(quota.c_str(), &end);
      if (quota == "max" || end == quota.c_str() || q <= 0 || period <= 0) return 0;
      return q / period;
    }
    std::ifstream q(dir + "/cpu.cfs_quota_us"), p(dir + "/cpu.cfs_period_us");
    double quota = 0, period = 0;
    if (!(q >> quota) || !(p >> period)) continue;
    return quota > 0 && period > 0 ? quota / period : 0;
  }
  return 0;
}
}  // namespace

double cgroup_cpu_limit(const std::string& proc_cgroup, const std::string& root) {
  // Inside a container the process's own cgroup is usually the root of its
  // view: try the path it names, then the root.
  const std::string v2 = cgroup_path(proc_cgroup, "");
  if (double l = read_limit({root + v2, root}, true); l > 0) return l;
  const std::string v1 = cgroup_path(proc_cgroup, "cpu");
  for (const std::string& dir : {root + "/cpu", root + "/cpu,cpuacct"})
    if (double l = read_limit({dir + v1, dir}, false); l > 0) return l;
  return 0;
}

bool shares_cpus(const std::vector<CpuMask>& masks, size_t me, double cpu_limit) {
  RELAXCC_ENFORCE_LT(me, masks.size(), InvalidArgument, "shares_cpus: rank ", me, " of ",
                     masks.size(), " masks");
  if (cpu_limit > 0 && static_cast<double>(masks.size()) > cpu_limit) return true;
  const auto overlap = [](const CpuMask& a, const CpuMask& b) {
    for (size_t w = 0; w < a.size(); ++w)
      if (a[w] & b[w]) return true;
    return false;
  };
  CpuMask spanned{};
  size_t ranks = 0;
  for (const CpuMask& m : masks) {
    if (!overlap(m, masks[me])) continue;
    ++ranks;
    for (size_t w = 0; w < m.size(); ++w) spanned[w] |= m[w];
  }
  size_t cpus = 0;
  for (uint64_t w : spanned) cpus += static_cast<size_t>(std::popcount(w));
  return ranks > cpus;
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
    // Node ids: nodes ordered by their leader's rank in `comm`. The ids are
    // host integers: a device communicator (NCCL) exchanges them over its
    // host communicator, whose node-local group has the same members, in the
    // same order, as the device one's.
    // Owned by their views: a timed-out collective's parked requests never
    // touch freed memory.
    const CommunicatorPtr host = comm.host_communicator();
    Communicator& exchange = host ? *host : comm;
    const CommunicatorPtr exchange_intra = host ? host->split_node_local() : h.intra;
    auto leader = std::make_shared<int32_t>(rank);
    exchange_intra->broadcast(TensorView::host(leader.get(), 1, leader), ExecContext::host(), {})
        ->wait();
    auto leaders_buf = std::make_shared<std::vector<int32_t>>(size);
    const std::vector<int32_t>& leaders = *leaders_buf;
    exchange
        .allgather(TensorView::host(leader.get(), 1, leader),
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
