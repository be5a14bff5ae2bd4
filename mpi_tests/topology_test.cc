// Node layout and the hierarchical communicators, detected (one machine:
// one node) or overridden with RELAXCC_RANKS_PER_NODE (CTest runs this
// program a second time with RELAXCC_RANKS_PER_NODE=2 at 4 ranks: 2 nodes x 2).
#include <gtest/gtest.h>

#include "relaxcc/errors.h"
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

TEST(Topology, OverrideMustDivideTheSize) {
  auto comm = test::world();
  if (comm->size() < 2) GTEST_SKIP() << "any override divides 1 rank";
  Tunables t;
  t.ranks_per_node = comm->size() + 1;
  EXPECT_THROW(build_hierarchy(*comm, t), InvalidArgument);
}

}  // namespace
}  // namespace relaxcc
