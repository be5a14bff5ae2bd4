// Membership views and agree_next_view over a real TcpStore: each member is a
// thread with its own store client (not an MPI program).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <latch>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "child_processes.h"
#include "relaxcc/errors.h"
#include "relaxcc/membership.h"
#include "relaxcc/store.h"
#include "relaxcc/tensor.h"
#include "relaxcc/ucx_communicator.h"

namespace relaxcc {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using test::ChildRun;
using test::fork_child;

// Members' own waits end within 20 s.
constexpr milliseconds kCollectTimeout{30000};

// What one member's agree_next_view gave: the view, or the Excluded view.
struct Outcome {
  std::optional<MembershipView> view;
  std::optional<MembershipView> excluded_from;
};

struct Member {
  int self;
  std::vector<int> lost;
};

class Agreement : public ::testing::Test {
 protected:
  Agreement() : server_(server_options()) {}

  static TcpStoreOptions server_options() {
    TcpStoreOptions o;
    o.is_server = true;
    o.timeout = milliseconds(10000);
    return o;
  }

  // Runs agree_next_view for every member at once, each on its own client.
  std::vector<Outcome> run(const MembershipView& current, const std::vector<Member>& members,
                           const AgreementOptions& options) {
    // Every member connects first, then all start together: a member whose
    // thread starts late is a slow member, which the protocol counts as lost.
    std::latch connected(static_cast<std::ptrdiff_t>(members.size()));
    std::vector<std::future<Outcome>> futures;
    for (const Member& m : members) {
      futures.push_back(std::async(std::launch::async, [this, current, m, options, &connected] {
        TcpStoreOptions o;
        o.port = server_.port();
        o.timeout = milliseconds(10000);
        TcpStore client(o);
        client.check({"connected"});
        connected.arrive_and_wait();
        Outcome out;
        try {
          out.view = agree_next_view(client, current, m.self, m.lost, options);
        } catch (const Excluded& e) {
          EXPECT_EQ(e.process_rank(), m.self);
          out.excluded_from = e.view();
        }
        return out;
      }));
    }
    std::vector<Outcome> outcomes;
    for (auto& f : futures) outcomes.push_back(f.get());
    return outcomes;
  }

  static AgreementOptions fast(const std::string& prefix) {
    AgreementOptions o;
    o.timeout = milliseconds(5000);
    o.proposal_wait = milliseconds(1500);
    o.key_prefix = prefix;
    return o;
  }

  TcpStore server_;
};

MembershipView first_view(int n) {
  MembershipView v;
  for (int i = 0; i < n; ++i) v.members.push_back(i);
  return v;
}

TEST(MembershipView, RankOfAndDescribe) {
  const MembershipView v{3, {0, 2, 5}};
  EXPECT_EQ(v.rank_of(0), 0);
  EXPECT_EQ(v.rank_of(2), 1);
  EXPECT_EQ(v.rank_of(5), 2);
  EXPECT_EQ(v.rank_of(1), -1);
  EXPECT_EQ(v.rank_of(6), -1);
  EXPECT_EQ(v.size(), 3);
  EXPECT_EQ(v.describe(), "epoch 3 {0,2,5}");
}

TEST_F(Agreement, ShrinkAtThreeAndFourMembers) {
  for (int n : {3, 4}) {
    const int lost = n == 3 ? 1 : 3;
    std::vector<Member> members;
    for (int r = 0; r < n; ++r) {
      if (r != lost) members.push_back({r, {lost}});
    }
    const auto outcomes = run(first_view(n), members, fast("shrink" + std::to_string(n)));
    MembershipView expected{1, {}};
    for (int r = 0; r < n; ++r) {
      if (r != lost) expected.members.push_back(r);
    }
    for (const Outcome& o : outcomes) {
      ASSERT_TRUE(o.view.has_value());
      EXPECT_EQ(*o.view, expected) << o.view->describe();
    }
  }
}

TEST_F(Agreement, SecondFailureDuringAgreement) {
  // Member 3 is lost; member 2 fails before it proposes: the others wait
  // proposal_wait for it, then leave it out too.
  const auto options = fast("second");
  const auto start = Clock::now();
  const auto outcomes = run(first_view(4), {{0, {3}}, {1, {3}}}, options);
  const auto took = Clock::now() - start;
  for (const Outcome& o : outcomes) {
    ASSERT_TRUE(o.view.has_value());
    EXPECT_EQ(*o.view, (MembershipView{1, {0, 1}}));
  }
  // The store server times the wait out on its own clock: allow 50 ms.
  EXPECT_GE(took, options.proposal_wait - milliseconds(50));
  EXPECT_LT(took, options.timeout);
}

// Real processes: member 3 is SIGKILLed before the agreement, member 2 is
// SIGKILLed while the others wait for its proposal; members 0 and 1 report
// the view they got through a pipe and exit 0.
TEST_F(Agreement, SigkilledProcessesDuringAgreement) {
  const MembershipView current = first_view(4);
  AgreementOptions options = fast("killed");
  std::vector<ChildRun> members;
  for (int r = 0; r < 4; ++r)
    members.push_back(fork_child([&, r] {
      TcpStoreOptions o;
      o.port = server_.port();
      o.timeout = milliseconds(10000);
      TcpStore client(o);
      if (r >= 2) {  // killed by the parent, or ends by itself within 20 s
        std::this_thread::sleep_for(milliseconds(20000));
        ::_exit(2);
      }
      return agree_next_view(client, current, r, {3}, options).describe();
    }));
  ::kill(members[3].pid, SIGKILL);
  std::this_thread::sleep_for(milliseconds(200));
  ::kill(members[2].pid, SIGKILL);
  test::collect_children(members, kCollectTimeout);
  for (int r = 0; r < 4; ++r) {
    const int status = members[r].status;
    if (r < 2) {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "member " << r;
      EXPECT_EQ(members[r].text, "epoch 1 {0,1}") << "member " << r;
    } else {
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "member " << r;
    }
  }
}

// shrink on the UCX wing: n processes on one communicator, the last is
// SIGKILLed; the survivors' allreduce fails, they shrink to epoch 1 over
// the others and sum data that encodes rank and index exactly there.
void shrink_after_kill(uint16_t port, int n) {
  std::vector<ChildRun> members;
  for (int r = 0; r < n; ++r)
    members.push_back(fork_child([port, n, r]() -> std::string {
      auto store = [&] {
        TcpStoreOptions o;
        o.port = port;
        o.timeout = milliseconds(10000);
        return std::make_shared<TcpStore>(o);
      }();
      UcxCommunicatorOptions u;
      u.store = store;
      u.rendezvous.rank = r;
      u.rendezvous.size = n;
      u.rendezvous.job = "shrink-test";
      u.timeout = milliseconds(10000);
      u.net_devices = "lo";
      CommunicatorPtr comm = create_ucx_communicator(u);
      MembershipView view{0, {}};
      for (int m = 0; m < n; ++m) view.members.push_back(m);
      std::vector<int32_t> data(1000);
      const TensorView x(data.data(), 1000, DType::i32);
      std::vector<int> lost;
      try {
        // Every member is past its creation once this completes, so the
        // loss below is seen by every survivor in the next allreduce.
        comm->allreduce(x, ExecContext::host())->wait();
        if (r == n - 1) ::raise(SIGKILL);
        comm->allreduce(x, ExecContext::host())->wait();
        return "allreduce over a killed member succeeded";
      } catch (const PeerLost& e) {
        if (e.peer() >= 0) lost.push_back(view.members[e.peer()]);
      } catch (const CommunicationError&) {
      }
      if (lost.empty()) lost.push_back(n - 1);
      ShrinkOptions o;
      o.store = store;
      o.self = r;
      o.lost = lost;
      o.agreement.proposal_wait = milliseconds(1000);
      o.agreement.key_prefix = "shrink-test/agreement";
      o.net_devices = "lo";
      ShrinkResult s = shrink(*comm, view, o);
      for (int i = 0; i < 1000; ++i) data[i] = s.comm->rank() * 1000 + i;
      s.comm->allreduce(x, ExecContext::host())->wait();
      const int m = s.comm->size();
      bool exact = true;
      for (int i = 0; i < 1000; ++i) exact = exact && data[i] == 1000 * m * (m - 1) / 2 + m * i;
      return s.view.describe() + (exact ? " exact" : " wrong sums");
    }));
  test::collect_children(members, kCollectTimeout);
  std::string expected = "epoch 1 {";
  for (int m = 0; m + 1 < n; ++m) expected += (m ? "," : "") + std::to_string(m);
  expected += "} exact";
  for (int r = 0; r < n; ++r) {
    const int status = members[r].status;
    if (r + 1 < n) {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "member " << r;
      EXPECT_EQ(members[r].text, expected) << "member " << r;
    } else {
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "member " << r;
    }
  }
}

TEST_F(Agreement, ShrinkAfterKillAt3) {
  shrink_after_kill(server_.port(), 3);
}
TEST_F(Agreement, ShrinkAfterKillAt4) {
  shrink_after_kill(server_.port(), 4);
}

TEST_F(Agreement, LostButAliveMemberIsExcluded) {
  // Members 0..2 report 3 lost; 3 is alive and reports nobody.
  const auto outcomes = run(first_view(4), {{0, {3}}, {1, {3}}, {2, {3}}, {3, {}}}, fast("alive"));
  const MembershipView expected{1, {0, 1, 2}};
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(outcomes[r].view.has_value()) << "member " << r;
    EXPECT_EQ(*outcomes[r].view, expected);
  }
  ASSERT_TRUE(outcomes[3].excluded_from.has_value());
  EXPECT_EQ(*outcomes[3].excluded_from, expected);

  // Arriving after the decision, it learns the same.
  const auto late = run(first_view(4), {{3, {}}}, fast("alive"));
  ASSERT_TRUE(late[0].excluded_from.has_value());
  EXPECT_EQ(*late[0].excluded_from, expected);
}

TEST_F(Agreement, DifferingReportsGiveOneView) {
  // Member 0 reports 3 lost, member 1 reports 2 and 3: one report suffices,
  // so 2 is left out and learns it; 0 and 1 hold the same view.
  const auto outcomes = run(first_view(4), {{0, {3}}, {1, {2, 3}}, {2, {3}}}, fast("differ"));
  const MembershipView expected{1, {0, 1}};
  ASSERT_TRUE(outcomes[0].view.has_value());
  ASSERT_TRUE(outcomes[1].view.has_value());
  EXPECT_EQ(*outcomes[0].view, expected);
  EXPECT_EQ(*outcomes[1].view, expected);
  ASSERT_TRUE(outcomes[2].excluded_from.has_value());
  EXPECT_EQ(*outcomes[2].excluded_from, expected);
}

TEST_F(Agreement, SuccessiveEpochs) {
  const auto options = fast("successive");
  auto outcomes = run(first_view(4), {{0, {1}}, {2, {1}}, {3, {1}}}, options);
  ASSERT_TRUE(outcomes[0].view.has_value());
  const MembershipView second = *outcomes[0].view;
  EXPECT_EQ(second, (MembershipView{1, {0, 2, 3}}));
  outcomes = run(second, {{0, {2}}, {3, {2}}}, options);
  for (const Outcome& o : outcomes) {
    ASSERT_TRUE(o.view.has_value());
    EXPECT_EQ(*o.view, (MembershipView{2, {0, 3}}));
  }
}

TEST_F(Agreement, RejectsANonMember) {
  TcpStoreOptions o;
  o.port = server_.port();
  TcpStore client(o);
  EXPECT_THROW(agree_next_view(client, MembershipView{1, {0, 2}}, 1, {}, fast("nonmember")),
               InvalidArgument);
}

}  // namespace
}  // namespace relaxcc
