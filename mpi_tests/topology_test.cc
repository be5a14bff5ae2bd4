// Node layout and the hierarchical communicators, detected (one machine:
// one node) or overridden with RELAXCC_RANKS_PER_NODE (CTest runs this
// program a second time with RELAXCC_RANKS_PER_NODE=2 at 4 ranks: 2 nodes x 2).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "relaxcc/errors.h"
#include "relaxcc/forwarding_communicator.h"
#include "relaxcc/topology.h"
#include "test_util.h"

namespace relaxcc {
namespace {

int32_t sum_over(Communicator& comm, int32_t value) {
  comm.allreduce(TensorView::host(&value, 1), ExecContext::host())->wait();
  return value;
}

TEST(Topology, LayoutAndCommunicators) {
  auto comm = test::world();
  const Tunables tunables = Tunables::from_env();
  const int n = comm->size(), r = comm->rank();
  HierarchicalComms h = build_hierarchy(*comm, tunables);
  const NodeLayout& l = h.layout;
  std::printf("[rank %d] node %d/%d local %d/%d%s, %s\n", r, l.node, l.num_nodes, l.local_rank,
              l.local_size, l.overridden ? " (override)" : "", l.hardware.c_str());
  EXPECT_FALSE(l.hardware.empty());
  const int per_node = tunables.ranks_per_node > 0 ? static_cast<int>(tunables.ranks_per_node) : n;
  EXPECT_EQ(l.overridden, tunables.ranks_per_node > 0);
  EXPECT_EQ(l.num_nodes, n / per_node);
  EXPECT_EQ(l.node, r / per_node);
  EXPECT_EQ(l.local_rank, r % per_node);
  EXPECT_EQ(l.local_size, per_node);
  ASSERT_NE(h.intra, nullptr);
  EXPECT_EQ(h.intra->size(), per_node);
  EXPECT_EQ(h.intra->rank(), l.local_rank);
  // The intra-node communicator reduces over this node's ranks only.
  const int first = l.node * per_node;
  EXPECT_EQ(sum_over(*h.intra, r), per_node * first + per_node * (per_node - 1) / 2);
  if (l.local_rank == 0) {
    ASSERT_NE(h.inter, nullptr);
    EXPECT_EQ(h.inter->size(), l.num_nodes);
    EXPECT_EQ(h.inter->rank(), l.node);
    // Leaders are ranks 0, per_node, 2 per_node, ...
    EXPECT_EQ(sum_over(*h.inter, r), per_node * l.num_nodes * (l.num_nodes - 1) / 2);
  } else {
    EXPECT_EQ(h.inter, nullptr);
  }
  // A hierarchical allreduce: reduce in the node, across leaders, back down.
  int32_t v = sum_over(*h.intra, r + 1);
  if (h.inter) v = sum_over(*h.inter, v);
  h.intra->broadcast(TensorView::host(&v, 1), ExecContext::host())->wait();
  EXPECT_EQ(v, n * (n + 1) / 2);
}

// A stand-in for a device communicator (NCCL) on the CPU: every data
// operation refuses host tensors, as the NCCL communicator's device rule
// does, and host_communicator() is the MPI communicator it wraps. Its splits
// and node-local groups are such stand-ins too.
class HostRefusingCommunicator final : public ForwardingCommunicator {
 public:
  using Communicator::allreduce;
  using ForwardingCommunicator::ForwardingCommunicator;

  std::shared_ptr<Communicator> host_communicator() const override { return inner_; }
  std::shared_ptr<Communicator> split(int color, int key, const SplitOptions& options) override {
    return wrap(inner_->split(color, key, options));
  }
  std::shared_ptr<Communicator> split_node_local(const SplitOptions& options) override {
    return wrap(inner_->split_node_local(options));
  }
  WorkPtr allreduce(const TensorView&, const TensorView&, const ExecContext&,
                    const AllreduceOptions&) override {
    refuse("allreduce");
  }
  WorkPtr allgather(const TensorView&, const TensorView&, const ExecContext&,
                    const AllgatherOptions&) override {
    refuse("allgather");
  }
  WorkPtr allgatherv(const TensorView&, const TensorView&, const std::vector<int64_t>&,
                     const ExecContext&, const AllgatherOptions&) override {
    refuse("allgatherv");
  }
  WorkPtr broadcast(const TensorView&, const ExecContext&, const BroadcastOptions&) override {
    refuse("broadcast");
  }
  WorkPtr point_to_point(const std::vector<P2POp>&, const ExecContext&,
                         const P2POptions&) override {
    refuse("point_to_point");
  }

 private:
  static CommunicatorPtr wrap(CommunicatorPtr c) {
    return c ? std::make_shared<HostRefusingCommunicator>(std::move(c)) : nullptr;
  }
  [[noreturn]] static void refuse(const char* op) {
    RELAXCC_THROW(InvalidArgument, "host-refusing communicator: ", op, " of a host tensor");
  }
};

// build_hierarchy on a device communicator (this stand-in for NCCL) makes
// its node-id exchange over the host communicator and gives the same layout
// as on MPI, with intra and inter communicators of the device kind.
TEST(Topology, DeviceCommunicatorExchangesOverItsHostCommunicator) {
  auto comm = test::world();
  const Tunables tunables = Tunables::from_env();
  auto device = std::make_shared<HostRefusingCommunicator>(comm);
  int32_t probe = 1;
  EXPECT_THROW(device->allreduce(TensorView::host(&probe, 1), ExecContext::host()),
               InvalidArgument);
  HierarchicalComms on_mpi = build_hierarchy(*comm, tunables);
  HierarchicalComms h = build_hierarchy(*device, tunables);
  EXPECT_EQ(h.layout.node, on_mpi.layout.node);
  EXPECT_EQ(h.layout.num_nodes, on_mpi.layout.num_nodes);
  EXPECT_EQ(h.layout.local_rank, on_mpi.layout.local_rank);
  EXPECT_EQ(h.layout.local_size, on_mpi.layout.local_size);
  ASSERT_NE(h.intra, nullptr);
  EXPECT_NE(dynamic_cast<HostRefusingCommunicator*>(h.intra.get()), nullptr);
  EXPECT_EQ(h.intra->rank(), on_mpi.intra->rank());
  EXPECT_EQ(h.intra->size(), on_mpi.intra->size());
  EXPECT_EQ(h.inter == nullptr, on_mpi.inter == nullptr);
  if (h.inter) {
    EXPECT_NE(dynamic_cast<HostRefusingCommunicator*>(h.inter.get()), nullptr);
    EXPECT_EQ(h.inter->rank(), on_mpi.inter->rank());
    EXPECT_EQ(h.inter->size(), on_mpi.inter->size());
  }
}

TEST(Topology, OverrideMustDivideTheSize) {
  auto comm = test::world();
  if (comm->size() < 2) GTEST_SKIP() << "any override divides 1 rank";
  Tunables t;
  t.ranks_per_node = comm->size() + 1;
  EXPECT_THROW(build_hierarchy(*comm, t), InvalidArgument);
}

CpuMask mask_of(std::initializer_list<int> cpus) {
  CpuMask m{};
  for (int c : cpus) m[c / 64] |= uint64_t{1} << (c % 64);
  return m;
}

TEST(CpuSharing, FromAffinityMasks) {
  // Unbound ranks on 2 CPUs: 2 ranks have one each, 4 share.
  const CpuMask both = mask_of({0, 1});
  EXPECT_FALSE(shares_cpus({both, both}, 0, 0));
  EXPECT_TRUE(shares_cpus({both, both, both, both}, 3, 0));
  // Bound to a core each: nobody shares, whatever the count.
  EXPECT_FALSE(shares_cpus({mask_of({0}), mask_of({1}), mask_of({2}), mask_of({3})}, 2, 0));
  // Two ranks bound to CPU 70 share it; a rank on CPUs 0-1 does not.
  const std::vector<CpuMask> mixed = {mask_of({70}), mask_of({70}), mask_of({0, 1})};
  EXPECT_TRUE(shares_cpus(mixed, 0, 0));
  EXPECT_TRUE(shares_cpus(mixed, 1, 0));
  EXPECT_FALSE(shares_cpus(mixed, 2, 0));
  // A quota of 1.5 CPUs: 2 ranks share, 1 does not.
  EXPECT_TRUE(shares_cpus({mask_of({0}), mask_of({1})}, 0, 1.5));
  EXPECT_FALSE(shares_cpus({both}, 0, 1.5));
  EXPECT_THROW(shares_cpus({both}, 1, 0), InvalidArgument);
  // This process's own mask names at least one CPU.
  const CpuMask own = own_cpu_mask();
  EXPECT_TRUE(std::any_of(own.begin(), own.end(), [](uint64_t w) { return w != 0; }));
}

// A fake /proc/self/cgroup and cgroup file system under a temporary folder.
class CgroupFiles {
 public:
  CgroupFiles() {
    char name[] = "/tmp/relaxcc-cgroup-XXXXXX";
    dir_ = mkdtemp(name);
  }
  ~CgroupFiles() { std::filesystem::remove_all(dir_); }
  void write(const std::string& path, const std::string& text) const {
    std::filesystem::create_directories(std::filesystem::path(dir_ + path).parent_path());
    std::ofstream(dir_ + path) << text;
  }
  double limit() const { return cgroup_cpu_limit(dir_ + "/proc_cgroup", dir_ + "/fs"); }

 private:
  std::string dir_;
};

TEST(CpuSharing, FromCgroupQuota) {
  {  // v2, quota on the process's own cgroup
    CgroupFiles f;
    f.write("/proc_cgroup", "0::/job/rank\n");
    f.write("/fs/job/rank/cpu.max", "150000 100000\n");
    EXPECT_DOUBLE_EQ(f.limit(), 1.5);
  }
  {  // v2, no quota
    CgroupFiles f;
    f.write("/proc_cgroup", "0::/\n");
    f.write("/fs/cpu.max", "max 100000\n");
    EXPECT_EQ(f.limit(), 0);
  }
  {  // v1, cpu and cpuacct mounted together
    CgroupFiles f;
    f.write("/proc_cgroup", "4:memory:/a\n3:cpu,cpuacct:/docker/x\n");
    f.write("/fs/cpu,cpuacct/docker/x/cpu.cfs_quota_us", "200000\n");
    f.write("/fs/cpu,cpuacct/docker/x/cpu.cfs_period_us", "100000\n");
    EXPECT_DOUBLE_EQ(f.limit(), 2.0);
  }
  {  // v1 unlimited (-1), and unreadable or corrupt files: no quota
    CgroupFiles f;
    f.write("/proc_cgroup", "3:cpu:/\n");
    f.write("/fs/cpu/cpu.cfs_quota_us", "-1\n");
    f.write("/fs/cpu/cpu.cfs_period_us", "100000\n");
    EXPECT_EQ(f.limit(), 0);
    CgroupFiles g;
    g.write("/proc_cgroup", "0::/\n");
    g.write("/fs/cpu.max", "garbage\n");
    EXPECT_EQ(g.limit(), 0);
    EXPECT_EQ(cgroup_cpu_limit("/nonexistent/cgroup", "/nonexistent"), 0);
  }
}

}  // namespace
}  // namespace relaxcc
