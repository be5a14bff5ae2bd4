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
#include <ostream>
#include <thread>
#include <vector>

#include "child_processes.h"
#include "relaxcc/errors.h"
#include "relaxcc/membership.h"
#include "relaxcc/store.h"
#include "relaxcc/tensor.h"
#include "relaxcc/ucx_communicator.h"

namespace relaxcc {
// Views in gtest's messages.
void PrintTo(const MembershipView& view, std::ostream* out) {
  *out << view.describe();
}

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
  // How long after the others this member starts its agreement.
  milliseconds delay{0};
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
    // Every member connects first, then all start together (less each
    // member's delay).
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
        std::this_thread::sleep_for(m.delay);
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

  // `timeout` is how long members wait for a silent member's proposal.
  static AgreementOptions fast(const std::string& prefix,
                               milliseconds timeout = milliseconds(3000)) {
    AgreementOptions o;
    o.timeout = timeout;
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
  // Member 3 is lost; member 2 fails before it proposes: nobody reports it
  // lost, so the others wait the whole timeout for it, then leave it out too.
  const auto options = fast("second", milliseconds(1500));
  const auto start = Clock::now();
  const auto outcomes = run(first_view(4), {{0, {3}}, {1, {3}}}, options);
  const auto took = Clock::now() - start;
  for (const Outcome& o : outcomes) {
    ASSERT_TRUE(o.view.has_value());
    EXPECT_EQ(*o.view, (MembershipView{1, {0, 1}}));
  }
  EXPECT_GE(took, options.timeout);
  EXPECT_LT(took, options.timeout + milliseconds(1000));
}

// Real processes: member 3 is SIGKILLed before the agreement, member 2 is
// SIGKILLed while the others wait for its proposal; members 0 and 1 report
// the view they got through a pipe and exit 0.
TEST_F(Agreement, SigkilledProcessesDuringAgreement) {
  const MembershipView current = first_view(4);
  AgreementOptions options = fast("killed", milliseconds(1500));
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

// shrink on the UCX wing: n processes on one communicator, on a view of
// process ranks kFirst.. (so communicator and process ranks differ); the last
// is SIGKILLed; the survivors' allreduce fails, they shrink and sum data that
// encodes rank and index exactly on the view they get, which each reports.
// With `die_in_creation`, member n-2 takes part in the agreement and is
// SIGKILLed before the new communicator exists. `shrink_timeout` is
// ViewChangeOptions::timeout.
constexpr int kFirst = 10;

std::vector<ChildRun> shrink_after_kill(uint16_t port, int n, bool die_in_creation,
                                        milliseconds shrink_timeout = milliseconds(30000)) {
  std::vector<ChildRun> members;
  for (int r = 0; r < n; ++r)
    members.push_back(fork_child([port, n, r, die_in_creation, shrink_timeout]() -> std::string {
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
      for (int m = 0; m < n; ++m) view.members.push_back(kFirst + m);
      std::vector<int32_t> data(1000);
      const TensorView x(data.data(), 1000, DType::i32);
      ViewChangeOptions o;
      o.store = store;
      try {
        // Every member is past its creation once this completes, so the
        // loss below is seen by every survivor in the next allreduce.
        comm->allreduce(x, ExecContext::host())->wait();
        if (r == n - 1) ::raise(SIGKILL);
        comm->allreduce(x, ExecContext::host())->wait();
        return "allreduce over a killed member succeeded";
      } catch (const PeerLost& e) {
        if (e.peer() >= 0) o.lost_ranks.push_back(e.peer());
      } catch (const CommunicationError&) {
      }
      if (o.lost_ranks.empty()) o.lost_ranks.push_back(n - 1);
      o.agreement.timeout = milliseconds(1500);
      o.agreement.key_prefix = "shrink-test/agreement";
      // Only the creation that waits for a dead member should time out.
      o.create_timeout = milliseconds(die_in_creation ? 2000 : 10000);
      o.timeout = shrink_timeout;
      o.net_devices = "lo";
      if (die_in_creation && r == n - 2) {
        agree_next_view(*store, view, view.members[r], {view.members[n - 1]}, o.agreement);
        ::raise(SIGKILL);
      }
      ViewChangeResult s = shrink(*comm, view, o);
      for (int i = 0; i < 1000; ++i) data[i] = s.comm->rank() * 1000 + i;
      s.comm->allreduce(x, ExecContext::host())->wait();
      const int m = s.comm->size();
      bool exact = true;
      for (int i = 0; i < 1000; ++i) exact = exact && data[i] == 1000 * m * (m - 1) / 2 + m * i;
      return s.view.describe() + (exact ? " exact" : " wrong sums");
    }));
  test::collect_children(members, kCollectTimeout);
  return members;
}

// The members below `survivors` exit 0 having reported `expected`; the others
// were SIGKILLed.
void expect_survivors(const std::vector<ChildRun>& members, int survivors,
                      const std::string& expected) {
  for (int r = 0; r < static_cast<int>(members.size()); ++r) {
    const int status = members[r].status;
    if (r < survivors) {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "member " << r;
      EXPECT_EQ(members[r].text, expected) << "member " << r;
    } else {
      EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "member " << r;
    }
  }
}

TEST_F(Agreement, ShrinkAfterKillAt3) {
  expect_survivors(shrink_after_kill(server_.port(), 3, false), 2, "epoch 1 {10,11} exact");
}
TEST_F(Agreement, ShrinkAfterKillAt4) {
  expect_survivors(shrink_after_kill(server_.port(), 4, false), 3, "epoch 1 {10,11,12} exact");
}

// Member 12 is in the view decided for epoch 1 and dies before its
// communicator exists: the survivors' creation times out, shrink agrees on
// epoch 2 without it (at the agreement's timeout) and returns that view's
// communicator.
TEST_F(Agreement, ShrinkAgainWhenAMemberDiesDuringCreation) {
  expect_survivors(shrink_after_kill(server_.port(), 4, true), 2, "epoch 2 {10,11} exact");
}

// As above with 3 processes and no time for a second attempt: the survivor
// gets Timeout naming the view whose communicator was not created and the
// member that never arrived.
TEST_F(Agreement, ShrinkStopsAtItsTimeout) {
  const auto members = shrink_after_kill(server_.port(), 3, true, milliseconds(0));
  ASSERT_TRUE(WIFEXITED(members[0].status) && WEXITSTATUS(members[0].status) == 0);
  const std::string& text = members[0].text;
  for (const char* part : {"Timeout", "the communicator of epoch 1 {10,11} was not created",
                           "rank 1 of 2 never arrived"})
    EXPECT_NE(text.find(part), std::string::npos) << part << " not in: " << text;
}

// shrink takes this process's rank from the communicator and the lost ranks
// as the communicator's ranks: a one-process communicator on view {7}.
TEST_F(Agreement, ShrinkTakesItsRanksFromTheCommunicator) {
  std::vector<ChildRun> members;
  members.push_back(fork_child([port = server_.port()]() -> std::string {
    TcpStoreOptions so;
    so.port = port;
    so.timeout = milliseconds(10000);
    auto store = std::make_shared<TcpStore>(so);
    UcxCommunicatorOptions u;
    u.store = store;
    u.rendezvous.rank = 0;
    u.rendezvous.size = 1;
    u.rendezvous.job = "alone";
    u.timeout = milliseconds(10000);
    u.net_devices = "lo";
    CommunicatorPtr comm = create_ucx_communicator(u);
    const MembershipView view{4, {7}};
    ViewChangeOptions o;
    o.store = store;
    o.agreement.key_prefix = "alone/agreement";
    o.net_devices = "lo";
    std::string out;
    for (int lost : {1, 0, -1}) {
      o.lost_ranks = {lost};
      try {
        shrink(*comm, view, o);
      } catch (const InvalidArgument&) {
        out += "lost rank " + std::to_string(lost) + " refused; ";
      }
    }
    o.lost_ranks.clear();
    const ViewChangeResult s = shrink(*comm, view, o);
    return out + s.view.describe() + " rank " + std::to_string(s.comm->rank()) + " of " +
           std::to_string(s.comm->size());
  }));
  test::collect_children(members, kCollectTimeout);
  EXPECT_EQ(members[0].text,
            "lost rank 1 refused; lost rank 0 refused; lost rank -1 refused; epoch 5 {7} rank 0 "
            "of 1");
}

// ---- join, grow and the state transfer ----

std::shared_ptr<TcpStore> client_of(uint16_t port) {
  TcpStoreOptions o;
  o.port = port;
  o.timeout = milliseconds(10000);
  return std::make_shared<TcpStore>(o);
}

// Rank r of `size` on the UCX wing over `store` (the job's first view).
CommunicatorPtr first_view_comm(std::shared_ptr<Store> store, int r, int size,
                                const std::string& job) {
  UcxCommunicatorOptions u;
  u.store = std::move(store);
  u.rendezvous.rank = r;
  u.rendezvous.size = size;
  u.rendezvous.job = job;
  u.timeout = milliseconds(10000);
  u.net_devices = "lo";
  return create_ucx_communicator(u);
}

ViewChangeOptions view_change_options(std::shared_ptr<Store> store, const std::string& job) {
  ViewChangeOptions o;
  o.store = std::move(store);
  o.agreement.key_prefix = job + "/agreement";
  o.job = job + "/views";
  o.net_devices = "lo";
  return o;
}

// The training state of the test: `bytes` bytes that encode their index.
std::vector<uint8_t> test_state(size_t bytes) {
  std::vector<uint8_t> state(bytes);
  for (size_t i = 0; i < bytes; ++i) state[i] = static_cast<uint8_t>((i * 131 + i / 251) & 0xff);
  return state;
}

// Sums of rank-coded data over `comm`, exact, and the state sync's outcome.
std::string after_admission(const ViewChangeResult& v, const std::vector<uint8_t>& state,
                            bool holds) {
  if (!v.comm) return v.view.describe() + ": no communicator (nobody admitted)";
  Communicator& comm = *v.comm;
  std::vector<int32_t> data(1000);
  for (int i = 0; i < 1000; ++i) data[i] = comm.rank() * 1000 + i;
  comm.allreduce(TensorView::host(data.data(), 1000), ExecContext::host())->wait();
  const int m = comm.size();
  bool exact = true;
  for (int i = 0; i < 1000; ++i) exact = exact && data[i] == 1000 * m * (m - 1) / 2 + m * i;
  const StateSyncResult s = sync_state(comm, state, holds);
  std::string sources, receivers;
  for (int r : s.sources) sources += std::to_string(r);
  for (int r : s.receivers) receivers += std::to_string(r);
  const bool same = s.state == test_state(state.empty() ? 300001 : state.size());
  return v.view.describe() + (exact ? " exact" : " wrong sums") + "; state from " + sources +
         " to " + receivers + (same ? " identical" : " differs");
}

// Until rank 0 of `comm` sees `n` newcomers waiting: it tells the other
// members in an allreduce, so that every member calls grow at the same
// point (a grow changes what pending_joiners reads).
void wait_for_newcomers(Communicator& comm, const ViewChangeOptions& o, int n) {
  auto waiting = std::make_shared<int32_t>(0);
  for (const auto deadline = Clock::now() + milliseconds(20000); *waiting < n;) {
    *waiting = comm.rank() == 0 ? static_cast<int32_t>(pending_joiners(o)) : 0;
    AllreduceOptions ao;
    ao.op = ReduceOp::max;
    comm.allreduce(TensorView::host(waiting.get(), 1, waiting), ExecContext::host(), ao)->wait();
    RELAXCC_ENFORCE(Clock::now() < deadline, Timeout, "the newcomers never came");
    std::this_thread::sleep_for(milliseconds(10));
  }
}

// Three members run on view {10,11,12}; two newcomers join. Rank 0 watches
// the store and tells the others when both wait (an allreduce: every member
// calls grow at the same point); the five then share a state of 300001
// bytes, which member 12 holds corrupted (one byte): it is resynced with the
// newcomers from shares of members 10 and 11.
TEST_F(Agreement, GrowAdmitsNewcomersAndSyncsTheirState) {
  const uint16_t port = server_.port();
  std::vector<ChildRun> runs;
  for (int r = 0; r < 3; ++r)
    runs.push_back(fork_child([port, r]() -> std::string {
      auto store = client_of(port);
      CommunicatorPtr comm = first_view_comm(store, r, 3, "grow-test/first");
      const ViewChangeOptions o = view_change_options(store, "grow-test");
      wait_for_newcomers(*comm, o, 2);
      const ViewChangeResult v = grow(*comm, MembershipView{0, {10, 11, 12}}, o);
      std::vector<uint8_t> state = test_state(300001);
      if (r == 2) state[150000] ^= 1;
      std::string out = after_admission(v, state, true);
      try {
        sync_state(*v.comm, {}, false);
        out += "; a sync without holders passed";
      } catch (const InvalidArgument&) {
      }
      return out;
    }));
  for (int j = 0; j < 2; ++j)
    runs.push_back(fork_child([port]() -> std::string {
      auto store = client_of(port);
      const ViewChangeResult v = join(view_change_options(store, "grow-test"), milliseconds(20000));
      std::string out = after_admission(v, {}, false);
      try {
        sync_state(*v.comm, {}, false);
        out += "; a sync without holders passed";
      } catch (const InvalidArgument&) {
      }
      return out;
    }));
  test::collect_children(runs, kCollectTimeout);
  for (const ChildRun& run : runs)
    EXPECT_EQ(run.text, "epoch 1 {10,11,12,13,14} exact; state from 01 to 234 identical");
}

// A newcomer whose wait runs out withdraws its ticket: the members' next
// grow leaves it out (no communicator: they keep theirs), and a grow after
// that admits the next newcomer with the next process rank.
TEST_F(Agreement, AWithdrawnNewcomerIsLeftOut) {
  const uint16_t port = server_.port();
  {
    auto store = client_of(port);
    const auto start = Clock::now();
    try {
      join(view_change_options(store, "withdraw-test"), milliseconds(300));
      ADD_FAILURE() << "join was admitted by nobody";
    } catch (const Timeout& e) {
      EXPECT_NE(std::string(e.what()).find("ticket 1 "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("withdrawn"), std::string::npos) << e.what();
    }
    EXPECT_LT(Clock::now() - start, milliseconds(5000));
    EXPECT_EQ(pending_joiners(view_change_options(store, "withdraw-test")), 1);
  }
  std::vector<ChildRun> runs;
  for (int r = 0; r < 2; ++r)
    runs.push_back(fork_child([port, r]() -> std::string {
      auto store = client_of(port);
      CommunicatorPtr comm = first_view_comm(store, r, 2, "withdraw-test/first");
      const ViewChangeOptions o = view_change_options(store, "withdraw-test");
      const ViewChangeResult none = grow(*comm, MembershipView{0, {0, 1}}, o);
      const std::string out = none.view.describe() + (none.comm ? " new" : " kept");
      // The next newcomer comes after that grow; both members grow again
      // once rank 0 saw it waiting.
      wait_for_newcomers(*comm, o, 1);
      const ViewChangeResult two = grow(*comm, none.view, o);
      return out + "; " + after_admission(two, test_state(300001), true);
    }));
  runs.push_back(fork_child([port]() -> std::string {
    auto store = client_of(port);
    const ViewChangeOptions o = view_change_options(store, "withdraw-test");
    // After the members' first grow (it stores where the next one starts).
    while (!store->check({"withdraw-test/agreement/join/next"}))
      std::this_thread::sleep_for(milliseconds(10));
    return after_admission(join(o, milliseconds(20000)), {}, false);
  }));
  test::collect_children(runs, kCollectTimeout);
  const std::string admitted = "epoch 1 {0,1,3} exact; state from 01 to 2 identical";
  EXPECT_EQ(runs[0].text, "epoch 0 {0,1} kept; " + admitted);
  EXPECT_EQ(runs[1].text, "epoch 0 {0,1} kept; " + admitted);
  EXPECT_EQ(runs[2].text, admitted);
}

TEST_F(Agreement, GrowAndJoinRejectBadArguments) {
  ViewChangeOptions o;
  EXPECT_THROW(pending_joiners(o), InvalidArgument);
  EXPECT_THROW(join(o, milliseconds(10)), InvalidArgument);
  o.store = client_of(server_.port());
  EXPECT_THROW(join(o, milliseconds(-1)), InvalidArgument);
  o.create_timeout = milliseconds(0);
  EXPECT_THROW(join(o, milliseconds(10)), InvalidArgument);
}

TEST_F(Agreement, ASlowMemberIsWaitedFor) {
  // Member 3 is lost; member 2 starts its agreement 1.7 s after the others.
  // Nobody reports it lost, so it is in the view.
  const auto outcomes =
      run(first_view(4), {{0, {3}}, {1, {3}}, {2, {3}, milliseconds(1700)}}, fast("slow"));
  for (const Outcome& o : outcomes) {
    ASSERT_TRUE(o.view.has_value());
    EXPECT_EQ(*o.view, (MembershipView{1, {0, 1, 2}}));
  }
}

TEST_F(Agreement, AMinorityAccuserIsLeftOutInsteadOfTheAccused) {
  // Member 0 reports others lost; 1, 2 and 3 hear from everyone.
  for (const auto& [prefix, accused] :
       {std::pair<std::string, std::vector<int>>{"minority-all", {1, 2, 3}},
        {"minority-one", {1}}}) {
    const auto outcomes =
        run(first_view(4), {{0, accused}, {1, {}}, {2, {}}, {3, {}}}, fast(prefix));
    const MembershipView expected{1, {1, 2, 3}};
    ASSERT_TRUE(outcomes[0].excluded_from.has_value()) << prefix;
    EXPECT_EQ(*outcomes[0].excluded_from, expected) << prefix;
    for (int r = 1; r < 4; ++r) {
      ASSERT_TRUE(outcomes[r].view.has_value()) << prefix << " member " << r;
      EXPECT_EQ(*outcomes[r].view, expected) << prefix << " member " << r;
    }
  }
}

TEST_F(Agreement, OfTwoMembersThatAccuseEachOtherOneStays) {
  // 0 and 1 cannot reach each other; 2 hears from both.
  const auto outcomes = run(first_view(3), {{0, {1}}, {1, {0}}, {2, {}}}, fast("mutual"));
  const MembershipView expected{1, {0, 2}};
  ASSERT_TRUE(outcomes[0].view.has_value());
  ASSERT_TRUE(outcomes[1].excluded_from.has_value());
  ASSERT_TRUE(outcomes[2].view.has_value());
  EXPECT_EQ(*outcomes[0].view, expected);
  EXPECT_EQ(*outcomes[1].excluded_from, expected);
  EXPECT_EQ(*outcomes[2].view, expected);
}

TEST_F(Agreement, GroupsOnOneStoreAtOneEpochAreApart) {
  const auto options = fast("groups");
  const auto a = run(MembershipView{0, {0, 1, 2}}, {{0, {2}}, {1, {2}}}, options);
  const auto b = run(MembershipView{0, {3, 4, 5}}, {{3, {5}}, {4, {5}}}, options);
  for (const Outcome& o : a) {
    ASSERT_TRUE(o.view.has_value());
    EXPECT_EQ(*o.view, (MembershipView{1, {0, 1}}));
  }
  for (const Outcome& o : b) {
    ASSERT_TRUE(o.view.has_value());
    EXPECT_EQ(*o.view, (MembershipView{1, {3, 4}}));
  }
}

TEST_F(Agreement, ADecisionThatIsNotOfTheViewIsRefused) {
  TcpStoreOptions so;
  so.port = server_.port();
  TcpStore client(so);
  const MembershipView current{2, {0, 2, 5}};
  const std::string key = "forged/" + std::to_string(current.fingerprint()) + "/epoch3/decision";
  for (const auto& [record, what] :
       {std::pair<std::string, std::string>{"3:0,2,7", "members {7} are not in the view"},
        {"4:0,2", "epoch 4 instead of 3"}}) {
    client.set(key, {record.begin(), record.end()});
    try {
      agree_next_view(client, current, 0, {5}, fast("forged"));
      ADD_FAILURE() << record << " adopted";
    } catch (const PeerMismatch& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
  client.set(key, {'3', ':', '0', ',', '2'});
  EXPECT_EQ(agree_next_view(client, current, 0, {5}, fast("forged")), (MembershipView{3, {0, 2}}));
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
  // Member 3 is lost. Member 1 reports 2 lost too, but 0 hears from 2: 1 is
  // the minority accuser, left out and told so; 0 and 2 hold the same view.
  const auto outcomes = run(first_view(4), {{0, {3}}, {1, {2, 3}}, {2, {3}}}, fast("differ"));
  const MembershipView expected{1, {0, 2}};
  ASSERT_TRUE(outcomes[0].view.has_value());
  ASSERT_TRUE(outcomes[2].view.has_value());
  EXPECT_EQ(*outcomes[0].view, expected);
  EXPECT_EQ(*outcomes[2].view, expected);
  ASSERT_TRUE(outcomes[1].excluded_from.has_value());
  EXPECT_EQ(*outcomes[1].excluded_from, expected);
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

TEST_F(Agreement, RejectsBadArguments) {
  TcpStoreOptions o;
  o.port = server_.port();
  TcpStore client(o);
  const MembershipView current{1, {0, 2}};
  EXPECT_THROW(agree_next_view(client, current, 1, {}, fast("bad")), InvalidArgument);
  EXPECT_THROW(agree_next_view(client, current, 0, {3}, fast("bad")), InvalidArgument);
  EXPECT_THROW(agree_next_view(client, current, 0, {}, fast("bad", milliseconds(0))),
               InvalidArgument);
  AgreementOptions no_prefix = fast("");
  EXPECT_THROW(agree_next_view(client, current, 0, {}, no_prefix), InvalidArgument);
}

}  // namespace
}  // namespace relaxcc
