// The decentralized primitives (relaxcc/relaxed/): gossip in every peer
// mode, group averaging (Moshpit) on grids and random groups, deadlines for
// slow peers and the adaptive deadline. Exact where theory says so (dyadic
// data), bounded where it does not.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "relaxcc/errors.h"
#include "relaxcc/forwarding_communicator.h"
#include "relaxcc/mpi_communicator.h"
#include "relaxcc/relaxed/adaptive_deadline.h"
#include "relaxcc/relaxed/async_average.h"
#include "relaxcc/relaxed/choco_gossip.h"
#include "relaxcc/relaxed/gossip.h"
#include "relaxcc/relaxed/group_average.h"
#include "relaxcc/traffic_counter.h"
#include "test_util.h"

namespace relaxcc {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::world;

constexpr GossipMode kPeerModes[] = {GossipMode::ring, GossipMode::shift_one,
                                     GossipMode::exponential};

// Dyadic test data: exact under halving for many rounds in f64.
double dyadic(int rank, int64_t i) {
  return (rank + 1) * 0.5 + static_cast<double>(i % 7) - 3.0;
}

std::vector<double> dyadic_vector(int rank, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = dyadic(rank, i);
  return v;
}

// Sum over ranks of `v`, element-wise (an MPI_Allreduce: the reference).
std::vector<double> sum_over_ranks(const std::vector<double>& v) {
  std::vector<double> out(v.size());
  MPI_Allreduce(v.data(), out.data(), static_cast<int>(v.size()), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
  return out;
}

TEST(GossipPeers, EveryModeIsDoublyStochasticAndConsistent) {
  for (GossipMode mode : kPeerModes) {
    for (int n = 1; n <= 9; ++n) {
      for (uint64_t round = 1; round <= 12; ++round) {
        std::vector<std::vector<double>> w(n, std::vector<double>(n, 0.0));
        std::vector<std::vector<int>> sends(n);
        for (int r = 0; r < n; ++r) {
          const GossipPeers p = gossip_peers(mode, r, n, round);
          w[r][r] += p.self_weight;
          for (size_t k = 0; k < p.recv_from.size(); ++k) w[r][p.recv_from[k]] += p.weights[k];
          sends[r] = p.send_to;
        }
        for (int r = 0; r < n; ++r) {
          double row = 0, col = 0;
          for (int c = 0; c < n; ++c) {
            row += w[r][c];
            col += w[c][r];
          }
          ASSERT_NEAR(row, 1.0, 1e-12) << gossip_mode_name(mode) << " n=" << n << " t=" << round;
          ASSERT_NEAR(col, 1.0, 1e-12) << gossip_mode_name(mode) << " n=" << n << " t=" << round;
          // Every send is someone's receive, and the reverse.
          for (int to : sends[r]) {
            const GossipPeers q = gossip_peers(mode, to, n, round);
            ASSERT_NE(std::find(q.recv_from.begin(), q.recv_from.end(), r), q.recv_from.end());
          }
        }
      }
    }
  }
  // shift_one meets every pair once over n-1 rounds (n even).
  for (int n : {2, 4, 6, 8}) {
    std::vector<int> met(n * n, 0);
    for (uint64_t t = 1; t < static_cast<uint64_t>(n); ++t)
      for (int r = 0; r < n; ++r)
        ++met[r * n + gossip_peers(GossipMode::shift_one, r, n, t).recv_from[0]];
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b) EXPECT_EQ(met[a * n + b], a == b ? 0 : 1) << n;
  }
}

// Full-precision gossip keeps the sum over ranks: exactly for the halving
// modes on dyadic data, and within float rounding for the ring's thirds.
TEST(Gossip, PreservesTheSumOverRanks) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  constexpr int64_t kCount = 1003;
  for (GossipMode mode : kPeerModes) {
    std::vector<double> x = dyadic_vector(me, kCount);
    const std::vector<double> before = sum_over_ranks(x);
    double max_abs = 0;
    for (double v : before) max_abs = std::max(max_abs, std::abs(v));
    GossipOptions options;
    options.mode = mode;
    for (uint64_t round = 1; round <= 20; ++round) {
      options.round = round;
      gossip(*comm, TensorView::host(x.data(), kCount), ExecContext::host(), options)->wait(30s);
    }
    const std::vector<double> after = sum_over_ranks(x);
    // Ring: each round rounds every value once (|error| <= eps |x|), so the
    // sum drifts by at most 20 rounds x n ranks x eps x max|x|.
    const double bound =
        mode == GossipMode::ring ? 20.0 * n * 2.3e-16 * std::max(max_abs, 1.0) : 0.0;
    for (int64_t i = 0; i < kCount; ++i)
      ASSERT_LE(std::abs(after[i] - before[i]), bound)
          << gossip_mode_name(mode) << " element " << i;
  }
}

// exponential reaches the exact global average in log2(n) rounds on a power
// of two ranks; `all` is the global average at once.
TEST(Gossip, ExponentialAndAllReachTheGlobalAverage) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  constexpr int64_t kCount = 100;
  std::vector<double> mean(kCount);
  for (int64_t i = 0; i < kCount; ++i) {
    double s = 0;
    for (int r = 0; r < n; ++r) s += dyadic(r, i);
    mean[i] = s / n;
  }
  std::vector<double> x = dyadic_vector(me, kCount);
  GossipOptions all;
  all.mode = GossipMode::all;
  gossip(*comm, TensorView::host(x.data(), kCount), ExecContext::host(), all)->wait(30s);
  for (int64_t i = 0; i < kCount; ++i) ASSERT_NEAR(x[i], mean[i], 1e-12);
  if ((n & (n - 1)) != 0) return;
  x = dyadic_vector(me, kCount);
  GossipOptions options;
  options.mode = GossipMode::exponential;
  int levels = 0;
  while ((1 << levels) < n) ++levels;
  for (int t = 1; t <= levels; ++t) {
    options.round = static_cast<uint64_t>(t);
    gossip(*comm, TensorView::host(x.data(), kCount), ExecContext::host(), options)->wait(30s);
  }
  for (int64_t i = 0; i < kCount; ++i) ASSERT_EQ(x[i], mean[i]) << "element " << i;
}

// Forwards to a communicator and keeps every group made through it, with
// its members, so that a test can read a group's transport counts
// (CommStats) after a primitive used it.
class GroupKeeper final : public ForwardingCommunicator {
 public:
  struct Kept {
    std::vector<int> members;
    CommunicatorPtr group;
  };
  using ForwardingCommunicator::ForwardingCommunicator;
  const std::vector<Kept>& groups() const { return groups_; }

  std::shared_ptr<Communicator> group(const std::vector<int>& members,
                                      const GroupOptions& options) override {
    CommunicatorPtr g = inner_->group(members, options);
    groups_.push_back({members, g});
    return g;
  }

 private:
  std::vector<Kept> groups_;
};

// "" when, for every rank i of a communicator (ranks[i] in the stats; empty
// ranks: i), the bytes counted as sent to and received from it are what
// the transport moved (after - before), less at most `header` bytes of the
// transport's own per edge; otherwise the first that differs.
std::string counted_against_transport(const RelaxedCounts& c, const CommStats& before,
                                      const CommStats& after, const std::vector<int>& ranks,
                                      uint64_t header) {
  const auto at = [](const std::vector<uint64_t>& v, size_t j) {
    return j < v.size() ? v[j] : uint64_t{0};
  };
  for (size_t i = 0; i < after.sent_to.size(); ++i) {
    const size_t peer = ranks.empty() ? i : static_cast<size_t>(ranks[i]);
    const uint64_t counted[2] = {at(c.sent_to, peer), at(c.received_from, peer)};
    const uint64_t moved[2] = {at(after.sent_to, i) - at(before.sent_to, i),
                               at(after.received_from, i) - at(before.received_from, i)};
    for (int d = 0; d < 2; ++d)
      if (moved[d] < counted[d] || moved[d] > counted[d] + header)
        return detail::concat(d == 0 ? "to" : "from", " rank ", peer, ": counted ", counted[d],
                              " bytes, the transport moved ", moved[d]);
  }
  return "";
}

// The allreduce rounds (gossip all; group averaging without a deadline)
// count per peer the bytes the transport moves, for a tensor small enough
// (1 KiB) for the allreduce's own choice to be recursive doubling, which
// moves other bytes to other peers than the ring: counted on the ring.
TEST(Stats, AllreduceRoundsCountWhatTheTransportMoved) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  constexpr int64_t kCount = 256;    // 1 KiB of f32
  constexpr uint64_t kHeader = 128;  // the transport's header per edge (80 bytes), at most
  std::vector<float> x(kCount, static_cast<float>(me));
  {
    RelaxedStats stats;
    GossipOptions all;
    all.mode = GossipMode::all;
    all.stats = &stats;
    comm->barrier()->wait(30s);
    const CommStats before = comm->stats();
    gossip(*comm, TensorView::host(x.data(), kCount), ExecContext::host(), all)->wait(30s);
    const CommStats after = comm->stats();
    EXPECT_EQ(stats.counts().rounds, 1u);
    EXPECT_GT(stats.counts().bytes_sent, 0u);
    EXPECT_EQ(counted_against_transport(stats.counts(), before, after, {}, kHeader), "")
        << "gossip all, rank " << me;
    for (float v : x) ASSERT_EQ(v, (n - 1) / 2.0f);
  }
  // One group of every rank; with 3 ranks or more, groups of a 2 x m grid
  // along its second axis, whose ranks are not the parent's.
  std::vector<GroupAverageOptions> cases(1);
  if (n >= 3) {
    cases.emplace_back();
    cases.back().grid = {2, (n + 1) / 2};
    cases.back().round = 2;
  }
  for (GroupAverageOptions& options : cases) {
    RelaxedStats stats;
    options.stats = &stats;
    GroupKeeper keeper(comm);
    comm->barrier()->wait(30s);
    group_average(keeper, TensorView::host(x.data(), kCount), ExecContext::host(), options)
        ->wait(30s);
    ASSERT_EQ(keeper.groups().size(), 1u);
    const GroupKeeper::Kept& kept = keeper.groups()[0];
    const std::string what = detail::concat("group_average round ", options.round, " of ",
                                            kept.members.size(), " members, rank ", me);
    EXPECT_EQ(counted_against_transport(stats.counts(), CommStats{}, kept.group->stats(),
                                        kept.members, kHeader),
              "")
        << what;
    if (kept.members.size() > 1) {
      EXPECT_GT(stats.counts().bytes_sent, 0u) << what;
    }
  }
}

// TrafficCounter (relaxcc/traffic_counter.h), which relaxcc-bench's
// algorithms mode reads bytes_per_step from, counts what the communicators
// made from it send: a group_average round without a deadline (as in
// moshpit_sgd:no-deadline) runs on a group of its own, which the given
// communicator's CommStats do not see. A group counts while it lives and
// after it was released, and the counter's own traffic counts too.
TEST(Stats, TrafficCounterCountsTheGroupsMadeFromIt) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  constexpr int64_t kCount = 4096;
  std::vector<float> x(kCount, static_cast<float>(me));
  const TensorView v = TensorView::host(x.data(), kCount);
  // Under the counter, the keeper keeps every group readable.
  auto keeper = std::make_shared<GroupKeeper>(comm);
  comm->barrier()->wait(30s);
  const uint64_t own_before = comm->stats().bytes_sent;
  auto counter = std::make_shared<TrafficCounter>(keeper);
  EXPECT_EQ(counter->bytes_sent(), 0u);

  group_average(*counter, v, ExecContext::host(), {})->wait(30s);
  ASSERT_EQ(keeper->groups().size(), 1u);
  const uint64_t round = keeper->groups()[0].group->stats().bytes_sent;
  EXPECT_GT(round, 0u);
  EXPECT_EQ(comm->stats().bytes_sent, own_before);  // none of it on comm itself
  EXPECT_EQ(counter->bytes_sent(), round);

  {
    std::vector<int> everyone(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) everyone[static_cast<size_t>(r)] = r;
    const CommunicatorPtr group = counter->group(everyone, {.key = 7});
    group->allreduce(v, ExecContext::host())->wait(30s);
  }  // released
  ASSERT_EQ(keeper->groups().size(), 2u);
  const uint64_t released = keeper->groups()[1].group->stats().bytes_sent;
  EXPECT_GT(released, 0u);
  EXPECT_EQ(counter->bytes_sent(), round + released);

  counter->allreduce(v, ExecContext::host())->wait(30s);
  const uint64_t own = comm->stats().bytes_sent - own_before;
  EXPECT_GT(own, 0u);
  EXPECT_EQ(counter->bytes_sent(), round + released + own);
}

TEST(Gossip, BadInputIsRejected) {
  auto comm = world();
  std::vector<float> x(8, 1.0f);
  const TensorView v = TensorView::host(x.data(), 8);
  GossipOptions options;
  options.round = 0;
  EXPECT_THROW(gossip(*comm, v, ExecContext::host(), options), InvalidArgument);
  if (comm->size() > 1) {
    options.round = 1;
    options.mode = GossipMode::exponential;
    options.weights = {0.5, 0.6};  // sums to 1.1
    EXPECT_THROW(gossip(*comm, v, ExecContext::host(), options), InvalidArgument);
  }
  // One weight more than this rank's and one per peer.
  GossipOptions extra;
  extra.mode = GossipMode::ring;
  const size_t peers =
      gossip_peers(GossipMode::ring, comm->rank(), comm->size(), 1).recv_from.size();
  extra.weights.assign(peers + 2, 1.0 / static_cast<double>(peers + 2));
  try {
    gossip(*comm, v, ExecContext::host(), extra);
    ADD_FAILURE() << "expected InvalidArgument for " << peers + 2 << " weights";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("weights"), std::string::npos) << e.what();
  }
  GossipOptions all;
  all.mode = GossipMode::all;
  all.deadline = Clock::now() + 1s;
  EXPECT_THROW(gossip(*comm, v, ExecContext::host(), all), InvalidArgument);
  std::vector<int32_t> ints(4, 1);
  EXPECT_THROW(gossip(*comm, TensorView::host(ints.data(), 4), ExecContext::host(), {}),
               InvalidArgument);
  EXPECT_THROW(parse_gossip_mode("star"), InvalidArgument);
  GroupAverageOptions grid;
  grid.grid = {comm->size() + 1, 2};  // an empty slice along the last axis
  EXPECT_THROW(group_members(grid, comm->rank(), comm->size()), InvalidArgument);
  grid.grid = {0};
  EXPECT_THROW(group_members(grid, comm->rank(), comm->size()), InvalidArgument);
  EXPECT_THROW(AdaptiveDeadline({.k = -1}), InvalidArgument);
}

// Two ranks that call different modes (same peers, same sizes) find out.
TEST(Gossip, RanksThatDisagreeGetPeerMismatch) {
  auto comm = world();
  if (comm->size() != 2) GTEST_SKIP() << "runs on 2 ranks";
  std::vector<float> x(16, 1.0f);
  GossipOptions options;
  options.round = 1;
  options.tag = 30200;
  options.mode = comm->rank() == 0 ? GossipMode::ring : GossipMode::shift_one;
  auto work = gossip(*comm, TensorView::host(x.data(), 16), ExecContext::host(), options);
  try {
    work->wait(30s);
    ADD_FAILURE() << "expected PeerMismatch";
  } catch (const PeerMismatch& e) {
    EXPECT_NE(std::string(e.what()).find("calls 'gossip"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(comm->poisoned());
}

// Rounds 1..d of group averaging of x over options.grid's d axes.
template <typename T>
void average_over_grid(Communicator& comm, std::vector<T>& x, GroupAverageOptions options) {
  for (size_t t = 1; t <= options.grid.size(); ++t) {
    options.round = t;
    group_average(comm, TensorView::host(x.data(), static_cast<int64_t>(x.size())),
                  ExecContext::host(), options)
        ->wait(30s);
  }
}

// Moshpit: N = M^d ranks reach the exact global average in d rounds.
TEST(GroupAverage, GridReachesTheGlobalAverageInDRounds) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  std::vector<int> grid;
  if (n == 4)
    grid = {2, 2};
  else if (n == 8)
    grid = {2, 2, 2};
  else
    grid = {n};
  constexpr int64_t kCount = 257;
  std::vector<double> x = dyadic_vector(me, kCount);
  GroupAverageOptions options;
  options.grid = grid;
  average_over_grid(*comm, x, options);
  for (int64_t i = 0; i < kCount; ++i) {
    double s = 0;
    for (int r = 0; r < n; ++r) s += dyadic(r, i);
    if (n == 1 || n == 2 || n == 4 || n == 8)
      ASSERT_EQ(x[i], s / n) << "element " << i;
    else
      ASSERT_NEAR(x[i], s / n, 1e-12) << "element " << i;
  }
}

// Compressed group averaging: each rank mixes its exact tensor with its
// group's decoded ones; after the grid's rounds every rank is within the
// codec's error of the global mean.
TEST(GroupAverage, CompressedGroupsReachTheMeanWithinTheCodecError) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  const std::vector<int> grid = n == 4 ? std::vector<int>{2, 2} : std::vector<int>{n};
  constexpr int64_t kCount = 3000;
  std::vector<float> x(kCount);
  for (int64_t i = 0; i < kCount; ++i) x[i] = static_cast<float>(dyadic(me, i));
  GroupAverageOptions options;
  options.grid = grid;
  options.codec = kernels::CompressorConfig{};
  options.codec->kind = kernels::CompressorKind::f16;
  average_over_grid(*comm, x, options);
  for (int64_t i = 0; i < kCount; ++i) {
    double s = 0;
    for (int r = 0; r < n; ++r) s += dyadic(r, i);
    // f16 keeps 11 bits: each round adds at most 2^-11 relative error per value.
    ASSERT_NEAR(x[i], s / n, 2.0 * grid.size() * std::pow(2.0, -11) * 6.0) << "element " << i;
  }
}

TEST(GroupAverage, UnevenGridGroups) {
  GroupAverageOptions options;
  options.grid = {2, 2};
  // 3 ranks on a 2x2 grid: rank 2 alone on axis 0, with rank 0 on axis 1.
  options.round = 1;
  EXPECT_EQ(group_members(options, 0, 3), (std::vector<int>{0, 1}));
  EXPECT_EQ(group_members(options, 2, 3), (std::vector<int>{2}));
  options.round = 2;
  EXPECT_EQ(group_members(options, 2, 3), (std::vector<int>{0, 2}));
  EXPECT_EQ(group_members(options, 1, 3), (std::vector<int>{1}));
}

// Random groups: with r equal groups of N ranks the spread contracts by
// (r - 1) / (N - 1) in expectation; measured over many rounds.
TEST(GroupAverage, RandomGroupsContractAsTheFormulaSays) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  if (n != 4) GTEST_SKIP() << "runs on 4 ranks (2 equal groups of 2)";
  constexpr int64_t kCount = 512;
  constexpr int kRounds = 60;
  double before_ss = 0, after_ss = 0;
  for (int round = 1; round <= kRounds; ++round) {
    std::mt19937_64 rng(static_cast<uint64_t>(round) * 1000 + static_cast<uint64_t>(me));
    std::normal_distribution<double> normal;
    std::vector<double> x(kCount);
    for (double& v : x) v = normal(rng);
    auto spread = [&] {
      const std::vector<double> s = sum_over_ranks(x);
      std::vector<double> sq(kCount);
      for (int64_t i = 0; i < kCount; ++i) sq[i] = (x[i] - s[i] / n) * (x[i] - s[i] / n);
      const std::vector<double> total = sum_over_ranks(sq);
      double ss = 0;
      for (double v : total) ss += v;
      return ss;
    };
    before_ss += spread();
    GroupAverageOptions options;
    options.random_groups = 2;
    options.seed = 7;
    options.round = static_cast<uint64_t>(round);
    group_average(*comm, TensorView::host(x.data(), kCount), ExecContext::host(), options)
        ->wait(30s);
    after_ss += spread();
  }
  const double ratio = after_ss / before_ss;
  EXPECT_NEAR(ratio, 1.0 / 3.0, 0.05) << "contraction per round";
}

// A rank that sleeps past the deadline in some rounds: the others go on
// without it, each result is exactly the weighted average over the peers
// that arrived, its late messages are dropped, nothing is poisoned.
TEST(Deadlines, GossipAndGroupsGoOnWithoutASlowRank) {
  const int n = test::world_size();
  if (n < 3) GTEST_SKIP() << "needs 3 ranks";
  auto comm = test::create_communicator();
  const int me = comm->rank(), slow = n - 1;
  RelaxedStats stats;
  constexpr int64_t kCount = 4096;
  int partial = 0;
  for (uint64_t round = 1; round <= 30; ++round) {
    if (me == slow && round % 3 == 0) std::this_thread::sleep_for(50ms);
    // Every rank starts the round from its own constant value.
    auto value = [&](int r) { return static_cast<double>(r * 100 + static_cast<int>(round)); };
    std::vector<double> x(kCount, value(me));
    WorkPtr work;
    std::vector<int> group;
    if (round % 2 == 1) {
      GossipOptions options;
      options.mode = GossipMode::ring;
      options.round = round;
      options.deadline = Clock::now() + 15ms;
      options.stats = &stats;
      work = gossip(*comm, TensorView::host(x.data(), kCount), ExecContext::host(), options);
    } else {
      GroupAverageOptions options;
      options.random_groups = 1;  // everyone: one group
      options.round = round;
      options.deadline = Clock::now() + 15ms;
      options.stats = &stats;
      work = group_average(*comm, TensorView::host(x.data(), kCount), ExecContext::host(), options);
    }
    work->wait(30s);
    const std::vector<int> arrived = work->contributors();
    // Every weight of these rounds is equal: the mean over this rank and
    // the peers that arrived.
    double expected = value(me);
    for (int p : arrived) expected += value(p);
    expected /= static_cast<double>(arrived.size() + 1);
    for (int64_t i = 0; i < kCount; ++i) ASSERT_DOUBLE_EQ(x[i], expected) << "round " << round;
    partial += work->partial() ? 1 : 0;
  }
  comm->barrier()->wait(30s);
  const RelaxedCounts counts = stats.counts();
  EXPECT_EQ(counts.rounds, 30u);
  EXPECT_EQ(static_cast<int>(counts.partial_rounds), partial);
  if (me != slow) {
    EXPECT_GE(partial, 3) << "the slow rank's rounds must go on without it";
    EXPECT_GT(counts.bytes_sent, 0u);
  }
  EXPECT_FALSE(comm->poisoned());
}

// Rank i's copy of its neighbour j is bitwise j's own copy.
void expect_copies_agree(const ChocoGossip& choco) {
  const std::vector<int>& peers = choco.neighbours();
  const auto count = static_cast<int>(choco.own_copy().size());
  for (size_t k = 0; k < peers.size(); ++k) {
    std::vector<float> theirs_own(static_cast<size_t>(count));
    // Send this rank's own copy to the neighbour on the other side.
    const int to = peers.size() == 1 ? peers[0] : peers[1 - k];
    MPI_Sendrecv(choco.own_copy().data(), count, MPI_FLOAT, to, 7, theirs_own.data(), count,
                 MPI_FLOAT, peers[k], 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    ASSERT_EQ(std::memcmp(theirs_own.data(), choco.neighbour_copies()[k].data(),
                          theirs_own.size() * sizeof(float)),
              0)
        << "copy of rank " << peers[k];
  }
}

// CHOCO on the ring with 8-bit min-max: the public copies agree bitwise
// across ranks, the mean drifts by no more than float rounding, and the
// ranks move towards consensus.
TEST(Choco, KeepsTheMeanAndCopiesAgreeAndConverges) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  constexpr int64_t kCount = 4096;
  std::mt19937_64 rng(static_cast<uint64_t>(me) + 11);
  std::normal_distribution<float> normal(static_cast<float>(me), 1.0f);
  std::vector<float> x(kCount);
  for (float& v : x) v = normal(rng);
  ChocoOptions options;
  options.codec.kind = kernels::CompressorKind::minmax;
  options.codec.bits = 8;
  options.gamma = 0.5;
  ChocoGossip choco(comm, kCount, options);
  auto as_double = [](const std::vector<float>& v) {
    return std::vector<double>(v.begin(), v.end());
  };
  auto spread = [&] {
    const std::vector<double> sum = sum_over_ranks(as_double(x));
    std::vector<double> sq(kCount);
    for (int64_t i = 0; i < kCount; ++i) sq[i] = std::pow(x[i] - sum[i] / n, 2);
    double total = 0;
    for (double v : sum_over_ranks(sq)) total += v;
    return total;
  };
  const double spread0 = spread();
  constexpr int kRounds = 40;
  for (uint64_t round = 1; round <= kRounds; ++round) {
    const std::vector<double> before = sum_over_ranks(as_double(x));
    choco.step(TensorView::host(x.data(), kCount), round, ExecContext::host())->wait(30s);
    const std::vector<double> after = sum_over_ranks(as_double(x));
    double max_abs = 1;
    for (float v : x) max_abs = std::max(max_abs, static_cast<double>(std::abs(v)));
    for (float v : choco.own_copy()) max_abs = std::max(max_abs, static_cast<double>(std::abs(v)));
    // Each rank rounds each element once per round (f32): c * n * eps * max|x|, c = 4.
    const double bound = 4.0 * n * 1.2e-7 * max_abs;
    for (int64_t i = 0; i < kCount; ++i)
      ASSERT_LE(std::abs(after[i] - before[i]), bound) << "round " << round << " element " << i;
  }
  EXPECT_LT(spread(), 0.25 * spread0) << "the ranks must move towards consensus";
  expect_copies_agree(choco);
  ChocoOptions bad;
  bad.gamma = 0;
  EXPECT_THROW(ChocoGossip(comm, 4, bad), InvalidArgument);
  bad.gamma = 0.5;
  bad.codec.bits = 3;
  EXPECT_THROW(ChocoGossip(comm, 4, bad), InvalidArgument);
}

// CHOCO rounds with a deadline: the last rank is slow in every round; the
// others go on without it (it is missing from some of their rounds), and no
// q is lost: after settle() every rank's copy of a neighbour is bitwise the
// neighbour's own, and the ranks moved towards consensus.
TEST(Choco, WithADeadlineASlowRankIsLeftOutAndNoQIsLost) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  constexpr int64_t kCount = 3000;
  std::vector<float> x(kCount);
  for (int64_t i = 0; i < kCount; ++i) x[i] = static_cast<float>(dyadic(me, i));
  ChocoOptions options;
  options.tag = 30320;
  options.gamma = 0.5;
  ChocoGossip choco(comm, kCount, options);
  if (n == 1) {
    // No neighbour: a round completes at once and x stays as it is.
    const std::vector<float> before = x;
    ChocoRound timing;
    timing.deadline = std::chrono::steady_clock::now() + 2ms;
    choco.step(TensorView::host(x.data(), kCount), 1, ExecContext::host(), timing)->wait(30s);
    EXPECT_EQ(x, before);
    return;
  }
  const bool slow = me == n - 1;
  int64_t missing = 0;
  constexpr int kRounds = 12;
  for (uint64_t round = 1; round <= kRounds; ++round) {
    if (slow) std::this_thread::sleep_for(20ms);
    ChocoRound timing;
    timing.deadline = std::chrono::steady_clock::now() + 2ms;
    WorkPtr w = choco.step(TensorView::host(x.data(), kCount), round, ExecContext::host(), timing);
    w->wait(30s);
    missing += static_cast<int64_t>(w->missing_peers().size());
    for (float v : x) ASSERT_TRUE(std::isfinite(v));
  }
  EXPECT_FALSE(choco.settled());
  EXPECT_THROW(choco.step(TensorView::host(x.data(), kCount), kRounds + 1, ExecContext::host()),
               InvalidArgument)
      << "a round without a deadline before settle()";
  choco.settle(30s);
  EXPECT_TRUE(choco.settled());
  // A neighbour of the slow rank (the slow rank's left neighbour on the
  // ring: rank n - 2) went on without it at least once.
  std::vector<int64_t> missed{missing};
  comm->allreduce(TensorView::host(missed.data(), 1), ExecContext::host())->wait(30s);
  EXPECT_GE(missed[0], 1) << "no round went on without the slow rank";
  expect_copies_agree(choco);
  EXPECT_FALSE(comm->poisoned());
}

// A round with a deadline is a composite of its sends and receives: a wait
// on it that expires before the deadline (rank 0 never comes) throws
// Timeout and times out the receive still pending, which poisons the
// communicator, on rank 0's neighbours (or one of them learns it from the
// other: CommunicatorPoisoned).
TEST(Choco, AnExpiredWaitOnARoundWithADeadlineTimesOutItsPendingReceive) {
  auto all = world();
  const int n = all->size(), me = all->rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  auto comm = all->split(0, me);  // this one ends poisoned
  ChocoOptions options;
  options.tag = 30330;
  ChocoGossip choco(comm, 100, options);
  std::vector<float> x(100, 1.0f);
  if (me != 0) {
    ChocoRound timing;
    timing.deadline = std::chrono::steady_clock::now() + 20s;
    WorkPtr w = choco.step(TensorView::host(x.data(), 100), 1, ExecContext::host(), timing);
    if (me == 1 || me == n - 1) {
      // Timeout, or (3 ranks or more) CommunicatorPoisoned from the other
      // neighbour of rank 0 when its wait expired first.
      std::string what = "nothing";
      try {
        w->wait(300ms);
      } catch (const Timeout&) {
        what = "Timeout";
      } catch (const CommunicatorPoisoned&) {
        what = "CommunicatorPoisoned";
      }
      EXPECT_NE(what, "nothing") << "the round completed without rank 0";
      EXPECT_TRUE(comm->poisoned());
    }
    try {
      w->wait(30s);
    } catch (const Error&) {
      // The round fails once its communicator is poisoned.
    }
  }
  all->barrier()->wait(30s);
}

// A round whose neighbours compress otherwise fails with PeerMismatch on
// every rank (each rank's codec differs from both its neighbours': f16
// against bf16 of the same size, checked by the payload header, and on an
// odd ring minmax, of another size, checked by the transport) and moves
// nothing: x and every public copy stay as they were, so ranks whose round
// failed together stay in step; the communicator stays usable.
TEST(Choco, AFailedRoundLeavesTheCopiesAsTheyWere) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  constexpr int64_t kCount = 1000;
  ChocoOptions options;
  options.tag = 30310;
  options.codec.kind = me == n - 1 && n % 2 == 1 ? kernels::CompressorKind::minmax
                       : me % 2 == 0             ? kernels::CompressorKind::f16
                                                 : kernels::CompressorKind::bf16;
  ChocoGossip choco(comm, kCount, options);
  std::vector<float> x(kCount);
  for (int64_t i = 0; i < kCount; ++i) x[i] = static_cast<float>(dyadic(me, i));
  const std::vector<float> before = x;
  EXPECT_THROW(choco.step(TensorView::host(x.data(), kCount), 1, ExecContext::host())->wait(30s),
               PeerMismatch);
  EXPECT_EQ(x, before);
  EXPECT_EQ(choco.own_copy(), std::vector<float>(kCount, 0.0f)) << "this rank's copy moved";
  for (size_t k = 0; k < choco.neighbours().size(); ++k)
    EXPECT_EQ(choco.neighbour_copies()[k], std::vector<float>(kCount, 0.0f))
        << "the copy of rank " << choco.neighbours()[k] << " moved";
  EXPECT_FALSE(comm->poisoned());
  comm->barrier()->wait(30s);
}

// Async averaging: converges to the mean, respects its staleness bound, and
// its Works never block a step that is within the bound.
TEST(AsyncAverage, ConvergesWithinItsStalenessBound) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  for (GossipMode mode : {GossipMode::all, GossipMode::ring}) {
    std::vector<double> x(1000, static_cast<double>(me));
    std::mutex lock;
    AsyncAverageOptions options;
    options.mode = mode;
    options.interval_steps = 2;
    options.max_staleness_steps = 3;
    // Every round waits for its peers: a round that leaves one out does not
    // keep the sum (the learned deadline's rounds are tested elsewhere).
    options.learn_deadline = false;
    AsyncModelAverager averager(comm, TensorView::host(x.data(), 1000), lock, options);
    for (int step = 0; step < 80; ++step) {
      averager.step();
      std::this_thread::sleep_for(1ms);  // the "compute"
    }
    averager.stop();
    const AsyncAverageCounts counts = averager.counts();
    EXPECT_GE(counts.applied, 10) << gossip_mode_name(mode);
    EXPECT_EQ(counts.applied, counts.started) << gossip_mode_name(mode);
    EXPECT_LE(counts.max_staleness_seen, options.max_staleness_steps) << gossip_mode_name(mode);
    const double mean = (n - 1) / 2.0;
    if (mode == GossipMode::all) {
      for (double v : x) ASSERT_NEAR(v, mean, 1e-6) << gossip_mode_name(mode);
    } else {
      // Gossip: a rank whose round is still in flight skips a due round, and
      // its neighbours' round then goes on without it (the sum is not
      // preserved there), so under load the ranks agree on a value near the
      // mean rather than on the mean itself.
      std::vector<double> spread = {x[0], -x[0]};
      AllreduceOptions max;
      max.op = ReduceOp::max;
      comm->allreduce(TensorView::host(spread.data(), 2), ExecContext::host(), max)->wait();
      EXPECT_LE(spread[0] + spread[1], 1e-3) << gossip_mode_name(mode);
      for (double v : x) ASSERT_NEAR(v, mean, 0.05) << gossip_mode_name(mode);
    }
    EXPECT_THROW(averager.step(), InvalidArgument);
  }
}

// A later averager on the same tag, of another size, starting past the
// earlier one's rounds (as async_model_average's averagers do after a plan
// change): the slow rank's late message of the earlier averager's round is
// dropped by its round, never taken into the later averager's round (it
// would be a PeerMismatch of sizes there, or a wrong average), and the
// later round averages exactly what its ranks sent.
TEST(AsyncAverage, ALaterAveragerOnTheSameTagDropsTheEarliersLateMessage) {
  const int n = test::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  auto comm = test::create_communicator();
  const int me = comm->rank(), slow = n - 1;
  const GossipPeers ring = gossip_peers(GossipMode::ring, me, n, 1);  // the same every round
  const bool hears_slow =
      std::find(ring.recv_from.begin(), ring.recv_from.end(), slow) != ring.recv_from.end();
  std::mutex lock;
  AsyncAverageOptions options;
  options.mode = GossipMode::ring;
  options.tag = 30500;
  options.round_deadline = 100ms;
  std::vector<double> first(64, 1.0);
  AsyncModelAverager earlier(comm, TensorView::host(first.data(), 64), lock, options);
  if (me == slow) std::this_thread::sleep_for(600ms);
  const uint64_t late_before = comm->stats().late_messages;
  earlier.step();  // round 1: the slow rank's message misses its peers' deadline
  earlier.stop();
  ASSERT_EQ(earlier.last_round(), 1u);
  constexpr int64_t kCount = 100;
  std::vector<double> y = dyadic_vector(me, kCount);
  options.first_round = earlier.last_round() + 1;
  options.round_deadline = 0ms;  // every peer's message is waited for
  options.learn_deadline = false;
  {
    AsyncModelAverager later(comm, TensorView::host(y.data(), kCount), lock, options);
    later.step();  // round 2, on the same tags
    EXPECT_EQ(later.last_round(), 2u);
    EXPECT_TRUE(later.stop());
  }
  for (int64_t i = 0; i < kCount; ++i) {
    double expected = ring.self_weight * dyadic(me, i);
    for (size_t k = 0; k < ring.recv_from.size(); ++k)
      expected += ring.weights[k] * dyadic(ring.recv_from[k], i);
    ASSERT_NEAR(y[i], expected, 1e-12) << "element " << i;
  }
  if (me != slow && hears_slow) {
    // The slow rank's round 1 message came after its receive gave up.
    const auto until = Clock::now() + 5s;
    while (comm->stats().late_messages == late_before && Clock::now() < until)
      std::this_thread::sleep_for(1ms);
    EXPECT_GT(comm->stats().late_messages, late_before);
  }
  comm->barrier()->wait(30s);
  EXPECT_FALSE(comm->poisoned());
}

// The constructor rejects what its header lists, before anything is sent.
TEST(AsyncAverage, BadOptionsAreRejected) {
  auto comm = world();
  std::vector<double> x(4);
  std::mutex lock;
  const auto rejects = [&](const AsyncAverageOptions& bad, const std::string& what) {
    try {
      AsyncModelAverager a(comm, TensorView::host(x.data(), 4), lock, bad);
      ADD_FAILURE() << "expected InvalidArgument for " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(detail::concat("rank ", comm->rank())),
                std::string::npos)
          << e.what();
    }
  };
  AsyncAverageOptions bad;
  bad.interval_steps = 0;
  rejects(bad, "interval_steps");
  bad = {};
  bad.mode = static_cast<GossipMode>(9);
  rejects(bad, "mode 9");
  bad = {};
  bad.mode = GossipMode::ring;
  bad.round_deadline = std::chrono::microseconds(-1);
  rejects(bad, "round_deadline");
  bad = {};
  bad.mode = GossipMode::all;
  bad.round_deadline = std::chrono::microseconds(1000);
  rejects(bad, "takes no deadline");
  AdaptiveDeadline adaptive;
  bad = {};
  bad.mode = GossipMode::all;
  bad.adaptive = &adaptive;
  rejects(bad, "takes no deadline");
  bad = {};
  bad.mode = GossipMode::shift_one;
  bad.tag = comm->max_p2p_tag();  // tag + 1 is beyond it
  rejects(bad, "tag");
  bad.tag = -1;
  rejects(bad, "tag");
  bad.tag = 30400;
  bad.first_round = 0;
  rejects(bad, "first_round");
  bad.first_round = 1;
  bad.mode = GossipMode::all;  // an allreduce: no tags
  AsyncModelAverager fine(comm, TensorView::host(x.data(), 4), lock, bad);
  EXPECT_TRUE(fine.stop());
}

// A training loop that holds the parameters' lock across a wait on another
// Work of the same engine (its gradient allreduce) neither deadlocks nor
// times out: averages are applied by step(), never on the engine's threads.
TEST(AsyncAverage, TrainingMayHoldItsLockAcrossWaits) {
  auto comm = world();
  const int n = comm->size(), me = comm->rank();
  std::vector<double> x(4096, static_cast<double>(me));
  std::mutex lock;
  AsyncAverageOptions options;
  options.mode = GossipMode::all;  // the exact mean at stop()
  options.stop_timeout = 5000ms;
  AsyncModelAverager averager(comm, TensorView::host(x.data(), 4096), lock, options);
  std::vector<int32_t> grad(1024);
  for (int step = 0; step < 40; ++step) {
    {
      std::lock_guard<std::mutex> hold(lock);
      std::fill(grad.begin(), grad.end(), me + step);
      comm->allreduce(TensorView::host(grad.data(), 1024), ExecContext::host())->wait(5000ms);
      ASSERT_EQ(grad[1023], n * step + n * (n - 1) / 2);
    }
    averager.step();
  }
  EXPECT_TRUE(averager.stop());
  EXPECT_GE(averager.counts().applied, 10);
  for (double v : x) ASSERT_NEAR(v, (n - 1) / 2.0, 1e-9);
}

// With its defaults (shift_one, a learned deadline) a rank slow from its
// first step holds nobody back: the others' steps do not wait for it, they
// leave it out of their rounds and tell it so; it learns it from their
// messages.
TEST(AsyncAverage, DefaultsLeaveAStragglerOutFromItsFirstStep) {
  const int n = test::world_size();
  if (n < 4) GTEST_SKIP() << "needs 4 ranks: a straggler and rounds without it";
  auto comm = test::create_communicator();
  const int me = comm->rank(), slow = n - 1;
  std::vector<float> x(1024, static_cast<float>(me));
  std::mutex lock;
  RelaxedStats stats;
  AsyncAverageOptions options;
  options.tag = 30600;
  options.stats = &stats;
  AsyncModelAverager averager(comm, TensorView::host(x.data(), 1024), lock, options);
  const int steps = me == slow ? 15 : 45;  // about as long on every rank
  const auto start = Clock::now();
  for (int step = 0; step < steps; ++step) {
    std::this_thread::sleep_for(me == slow ? 30ms : 10ms);
    averager.step();
  }
  const auto took = Clock::now() - start;
  averager.stop();
  const RelaxedCounts c = stats.counts();
  if (me != slow) {
    // 450 ms of compute; at the straggler's pace it would be 1350 ms.
    EXPECT_LT(took, 1000ms) << "the steps waited for the straggler";
    ASSERT_NE(averager.learned_deadline(), nullptr);
    EXPECT_TRUE(averager.learned_deadline()->straggler(slow));
    EXPECT_LT(averager.learned_deadline()->current(), 30ms);
  } else {
    uint64_t told = 0;
    for (uint64_t v : c.left_out_by) told += v;
    EXPECT_GT(told, 0u) << "the straggler never learned that it was left out";
  }
  comm->barrier()->wait(30s);
  EXPECT_FALSE(comm->poisoned());
}

// stop() returns within its timeout while a peer is slow, and a late
// average is never applied after it.
TEST(AsyncAverage, StopsCleanlyWhileAPeerIsSlow) {
  const int n = test::world_size();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  auto comm = test::create_communicator();
  const int me = comm->rank(), slow = n - 1;
  std::vector<float> x(256, static_cast<float>(me));
  std::mutex lock;
  AsyncAverageOptions options;
  options.mode = GossipMode::all;  // every rank's round waits for the slow one
  options.stop_timeout = 200ms;
  options.max_staleness_steps = 100;
  options.warmup_steps = 5;  // the first average starts at step 6
  {
    AsyncModelAverager averager(comm, TensorView::host(x.data(), 256), lock, options);
    for (int step = 0; step < 5; ++step) averager.step();
    if (me == slow) std::this_thread::sleep_for(1500ms);
    averager.step();  // starts an average the slow rank joins late
    EXPECT_EQ(averager.counts().started, 1);
    const auto t0 = Clock::now();
    const bool applied = averager.stop();
    const auto took = Clock::now() - t0;
    if (me != slow) {
      EXPECT_LT(took, 1000ms) << "stop() must not wait for the slow peer";
      EXPECT_FALSE(applied);
      const std::vector<float> at_stop = x;
      comm->barrier()->wait(30s);  // the slow rank has joined: the average completed
      std::this_thread::sleep_for(50ms);
      EXPECT_EQ(x, at_stop) << "a late average was applied after stop()";
    } else {
      comm->barrier()->wait(30s);
    }
  }
  EXPECT_FALSE(comm->poisoned());
}

TEST(AdaptiveDeadline, FastestQuorumSetsTheDeadlineClampedToFloorAndCap) {
  AdaptiveDeadline d({.k = 2.0,
                      .quorum = 0.5,
                      .floor_fraction = 0.1,
                      .min_floor = 100us,
                      .cap = 50ms,
                      .window = 8,
                      .straggler_misses = 2,
                      .probe_interval = 4});
  EXPECT_EQ(d.current(), 50ms);  // nothing seen yet: the cap
  for (int us : {1000, 1200, 800, 1000, 5000}) d.observe(1, std::chrono::microseconds(us));
  // One peer: median 1000, deviations {0, 200, 200, 0, 4000}: MAD 200.
  EXPECT_EQ(d.current(), 1400us);
  // A slow peer outside the fastest half of the two peers changes nothing.
  for (int i = 0; i < 8; ++i) d.observe(2, 40ms);
  EXPECT_EQ(d.current(), 1400us);
  // Three peers: the fastest two pool their arrivals.
  for (int i = 0; i < 5; ++i) d.observe(3, 1000us);
  // Pooled {1000, 1200, 800, 1000, 5000} and five 1000: median 1000, MAD 0.
  EXPECT_EQ(d.current(), 1000us);
  for (int i = 0; i < 8; ++i) d.observe(1, 10us);
  for (int i = 0; i < 8; ++i) d.observe(3, 10us);
  EXPECT_EQ(d.current(), 100us);  // min_floor
  // Rounds 20 ms apart: the floor is a tenth of that.
  const auto t0 = Clock::now();
  d.begin_round(1, t0);
  d.begin_round(1, t0 + 5ms);  // another tensor of round 1: no interval
  d.begin_round(2, t0 + 20ms);
  d.begin_round(4, t0 + 60ms);
  EXPECT_EQ(d.floor(), 2000us);
  EXPECT_EQ(d.current(), 2000us);
  for (int i = 0; i < 8; ++i) d.observe(1, 1s);
  for (int i = 0; i < 8; ++i) d.observe(3, 1s);
  EXPECT_EQ(d.current(), 50ms);  // the cap
}

TEST(AdaptiveDeadline, StragglerIsLeftOutProbedAndBackOnceOnTime) {
  AdaptiveDeadline d(
      {.k = 3.0, .min_floor = 1ms, .cap = 100ms, .straggler_misses = 2, .probe_interval = 3});
  d.observe(0, 500us);
  EXPECT_FALSE(d.wait_for(1, 1).straggler);
  d.missed(1, 1);
  d.missed(1, 1);  // another tensor of round 1: one miss
  EXPECT_FALSE(d.straggler(1));
  d.missed(1, 2);
  EXPECT_TRUE(d.straggler(1));
  // No round waits for it; every third listens for it in the background
  // (four round intervals; the cap while no interval is known).
  std::vector<int> probes;
  for (int round = 3; round <= 11; ++round) {
    const AdaptiveDeadline::Wait w = d.wait_for(1, round);
    EXPECT_TRUE(w.straggler) << "round " << round;
    EXPECT_EQ(w.wait, 0us) << "round " << round;
    if (w.probe.count() > 0) {
      probes.push_back(round);
      EXPECT_EQ(w.probe, 100ms) << "round " << round;
    }
    // Another tensor of the same round: the same answer, not another round.
    const AdaptiveDeadline::Wait again = d.wait_for(1, round);
    EXPECT_EQ(again.probe, w.probe) << "round " << round;
    d.missed(1, round);
  }
  EXPECT_EQ(probes, (std::vector<int>{5, 8, 11}));
  // A probe heard it 30 ms late (behind in phase): the next round waits for
  // that once, then the peer is judged by the deadline again.
  d.caught_up(1, 30ms);
  EXPECT_FALSE(d.straggler(1));
  const AdaptiveDeadline::Wait once = d.wait_for(1, 12);
  EXPECT_FALSE(once.straggler);
  EXPECT_EQ(once.wait, 30ms + d.current());
  EXPECT_EQ(d.wait_for(1, 12).wait, once.wait);  // every tensor of round 12
  EXPECT_EQ(d.wait_for(1, 13).wait, d.current());
  d.missed(1, 13);
  d.missed(1, 14);
  EXPECT_TRUE(d.straggler(1));
  d.observe(1, 800us);  // on time: a peer like the others again
  EXPECT_FALSE(d.straggler(1));
  EXPECT_FALSE(d.wait_for(1, 1).straggler);
  const auto peers = d.peers();
  ASSERT_EQ(peers.size(), 2u);
  EXPECT_EQ(peers[1].peer, 1);
  EXPECT_EQ(peers[1].arrived, 1);
  EXPECT_EQ(peers[1].left_out, 14);  // every call, both tensors of round 1 too
  EXPECT_EQ(peers[1].median, 800us);
}

// With a rank that is always slow and a minority of the peers, the adaptive
// deadline follows the others' arrivals, not the straggler's: the rounds stop
// waiting for it.
TEST(AdaptiveDeadline, FollowsTheFastPeersWhenOneIsSlow) {
  const int n = test::world_size();
  if (n < 4) GTEST_SKIP() << "needs 4 ranks: the straggler a third of the peers";
  auto comm = test::create_communicator();
  const int me = comm->rank(), slow = n - 1;
  AdaptiveDeadline adaptive({.k = 3.0, .min_floor = 1ms, .cap = 200ms, .window = 32});
  std::vector<float> x(1024, 1.0f);
  int partial = 0;
  for (uint64_t round = 1; round <= 25; ++round) {
    if (me == slow) std::this_thread::sleep_for(40ms);
    GroupAverageOptions options;
    options.random_groups = 1;  // everyone
    options.round = round;
    options.adaptive = &adaptive;
    auto work =
        group_average(*comm, TensorView::host(x.data(), 1024), ExecContext::host(), options);
    work->wait(30s);
    partial += work->partial() ? 1 : 0;
  }
  comm->barrier()->wait(30s);
  if (me != slow) {
    EXPECT_LT(adaptive.current(), 40ms) << "the deadline must not wait for the straggler";
    EXPECT_GE(partial, 15) << "rounds go on without the straggler";
  }
}

}  // namespace
}  // namespace relaxcc
