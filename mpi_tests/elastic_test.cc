// The elastic Reducer (ReducerOptions::elastic): processes on the UCX wing
// train with a Reducer; one is SIGKILLed in the middle of a step; the
// survivors' synchronize() changes the view and runs the step again, and
// every later step averages over the survivors. Each member is a forked
// process with its own store client (not an MPI program).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "child_processes.h"
#include "relaxcc/algorithms/bytegrad.h"
#include "relaxcc/algorithms/gradient_allreduce.h"
#include "relaxcc/algorithms/local_sgd.h"
#include "relaxcc/algorithms/qadam.h"
#include "relaxcc/errors.h"
#include "relaxcc/hash.h"
#include "relaxcc/membership.h"
#include "relaxcc/optimizer.h"
#include "relaxcc/reducer.h"
#include "relaxcc/store.h"
#include "relaxcc/ucx_communicator.h"

namespace relaxcc {
namespace {

using std::chrono::milliseconds;
using test::ChildRun;
using test::fork_child;

constexpr milliseconds kCollectTimeout{60000};
constexpr int kSteps = 6;
constexpr int kKillStep = 3;  // the last member dies after marking this step's gradients
const std::vector<int64_t> kSizes = {1000, 3000, 517};

class Elastic : public ::testing::Test {
 protected:
  Elastic() : server_(server_options()) {}
  static TcpStoreOptions server_options() {
    TcpStoreOptions o;
    o.is_server = true;
    o.timeout = milliseconds(10000);
    return o;
  }
  TcpStore server_;
};

std::shared_ptr<TcpStore> client(uint16_t port) {
  TcpStoreOptions o;
  o.port = port;
  o.timeout = milliseconds(10000);
  return std::make_shared<TcpStore>(o);
}

CommunicatorPtr ucx_comm(const std::shared_ptr<Store>& store, int rank, int size,
                         const std::string& job) {
  UcxCommunicatorOptions u;
  u.store = store;
  u.rendezvous.rank = rank;
  u.rendezvous.size = size;
  u.rendezvous.job = job;
  u.timeout = milliseconds(10000);
  u.net_devices = "lo";
  return create_ucx_communicator(u);
}

ElasticOptions elastic_options(const std::shared_ptr<Store>& store, int n, const std::string& job) {
  ElasticOptions e;
  for (int m = 0; m < n; ++m) e.view.members.push_back(m);
  e.view_change.store = store;
  e.view_change.agreement.timeout = milliseconds(3000);
  e.view_change.agreement.key_prefix = job + "/agreement";
  e.view_change.job = job + "/shrink";
  e.view_change.net_devices = "lo";
  return e;
}

// Member `r` of `n`: its gradient at step s, element i of tensor t. Integers
// below 2^24, so sums and averages over 3 or 4 members are exact in f32.
float gradient(int r, int s, int t, int64_t i) {
  return static_cast<float>((r + 1) * (s + 1) * 8 + t * 100000 + i);
}

// The average over `members` (process ranks) of their gradients.
float average(const std::vector<int>& members, int s, int t, int64_t i) {
  double sum = 0;
  for (int m : members) sum += gradient(m, s, t, i);
  return static_cast<float>(sum / static_cast<double>(members.size()));
}

// A member's tensors as a Reducer takes them: gradients of `sizes`
// (registered first, tensor t's parameter is tensor sizes.size() + t) and
// their parameters. Not moved once built: the specs point into it.
struct Tensors {
  explicit Tensors(std::vector<int64_t> sizes_) : sizes(std::move(sizes_)) {
    for (int64_t size : sizes) {
      grads.emplace_back(static_cast<size_t>(size));
      params.emplace_back(static_cast<size_t>(size), 0.0f);
    }
    for (size_t t = 0; t < sizes.size(); ++t)
      specs.push_back({"g" + std::to_string(t), TensorView::host(grads[t].data(), sizes[t]),
                       TensorRole::gradient, static_cast<int>(sizes.size() + t)});
    for (size_t t = 0; t < sizes.size(); ++t)
      specs.push_back({"p" + std::to_string(t), TensorView::host(params[t].data(), sizes[t]),
                       TensorRole::parameter, -1});
  }
  Tensors(const Tensors&) = delete;
  Tensors& operator=(const Tensors&) = delete;
  // Member r's gradients at step s.
  void fill(int r, int s) {
    for (size_t t = 0; t < sizes.size(); ++t)
      for (int64_t i = 0; i < sizes[t]; ++i)
        grads[t][static_cast<size_t>(i)] = gradient(r, s, static_cast<int>(t), i);
  }
  // Marks every gradient ready, the last registered first.
  void mark_all(Reducer& reducer) const {
    for (int t = static_cast<int>(sizes.size()) - 1; t >= 0; --t) reducer.mark_ready(t);
  }

  std::vector<int64_t> sizes;
  std::vector<std::vector<float>> grads, params;
  std::vector<TensorSpec> specs;
};

// n members train kSteps steps of `algorithm` (a maker, called in the child);
// member n-1 dies after marking step kKillStep's gradients. Each survivor
// reports, per step, its view and how far its results are from the exact
// average over that view (the largest relative error), and a checksum of
// its final results (the same on every survivor).
std::vector<ChildRun> train_with_a_kill(uint16_t port, int n, const std::string& job,
                                        AlgorithmPtr (*make)()) {
  std::vector<ChildRun> members;
  for (int r = 0; r < n; ++r)
    members.push_back(fork_child([port, n, r, job, make]() -> std::string {
      auto store = client(port);
      CommunicatorPtr comm = ucx_comm(store, r, n, job);
      Tensors x(kSizes);
      const auto& grads = x.grads;
      ReducerOptions ro;
      ro.elastic = elastic_options(store, n, job);
      ro.plan.cap_bytes = 8 << 10;  // several buckets
      ro.plan.first_cap_bytes = 4 << 10;
      Reducer reducer(comm, x.specs, make(), ExecContext::host(), ro);
      std::ostringstream out;
      double checksum = 0;
      for (int s = 0; s < kSteps; ++s) {
        x.fill(r, s);
        reducer.begin_step();
        // Registered first, ready last (the plan is rebuilt after step 0).
        x.mark_all(reducer);
        if (r == n - 1 && s == kKillStep) ::raise(SIGKILL);
        reducer.synchronize();
        const MembershipView view = reducer.view();
        double worst = 0;
        for (size_t t = 0; t < kSizes.size(); ++t)
          for (int64_t i = 0; i < kSizes[t]; ++i) {
            const double want = average(view.members, s, static_cast<int>(t), i);
            const double got = grads[t][static_cast<size_t>(i)];
            worst = std::max(worst, std::abs(got - want) / std::max(1.0, std::abs(want)));
            if (s == kSteps - 1) checksum += got * static_cast<double>(i % 7 + 1);
          }
        out << "step " << s << ": " << view.describe() << " size " << reducer.communicator()->size()
            << " error " << (worst == 0 ? "0" : "");
        if (worst != 0) out << (worst < 0.02 ? "<2%" : "LARGE(" + std::to_string(worst) + ")");
        out << "\n";
      }
      out << "checksum " << checksum;
      return out.str();
    }));
  test::collect_children(members, kCollectTimeout);
  return members;
}

// The survivors' reports, checked: every step before the kill on epoch 0
// of all members, from the kill on epoch 1 without the last; exact results
// when `exact`, else within 2%; one checksum on every survivor.
void expect_survived(const std::vector<ChildRun>& members, bool exact) {
  const int n = static_cast<int>(members.size());
  std::string all = "{0", rest = "{0";
  for (int m = 1; m < n; ++m) {
    all += "," + std::to_string(m);
    if (m < n - 1) rest += "," + std::to_string(m);
  }
  all += "}";
  rest += "}";
  std::string checksum;
  for (int r = 0; r < n; ++r) {
    const ChildRun& c = members[static_cast<size_t>(r)];
    if (r == n - 1) {
      EXPECT_TRUE(WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGKILL) << c.text;
      continue;
    }
    ASSERT_TRUE(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)
        << "member " << r << ": " << c.text;
    std::istringstream lines(c.text);
    std::string line;
    for (int s = 0; s < kSteps; ++s) {
      ASSERT_TRUE(std::getline(lines, line)) << c.text;
      const std::string view = s < kKillStep ? "epoch 0 " + all : "epoch 1 " + rest;
      const int size = s < kKillStep ? n : n - 1;
      const std::string want = "step " + std::to_string(s) + ": " + view + " size " +
                               std::to_string(size) + " error " + (exact ? "0" : "");
      if (exact)
        EXPECT_EQ(line, want) << "member " << r;
      else
        EXPECT_TRUE(line == want + "0" || line == want + "<2%") << "member " << r << ": " << line;
    }
    ASSERT_TRUE(std::getline(lines, line));
    if (checksum.empty()) checksum = line;
    EXPECT_EQ(line, checksum) << "member " << r << " ends with other results than member 0";
  }
}

AlgorithmPtr make_gradient_allreduce() {
  return std::make_shared<algorithms::GradientAllreduce>();
}
AlgorithmPtr make_qadam() {
  algorithms::QAdamOptions o;
  o.warmup_steps = 2;  // compressed momentum from step 2 on
  return std::make_shared<algorithms::QAdam>(o);
}
AlgorithmPtr make_bytegrad() {
  algorithms::ByteGradOptions o;
  o.error_feedback = true;
  o.hierarchical = false;
  return std::make_shared<algorithms::ByteGrad>(o);
}

// gradient_allreduce: the step the last member dies in is averaged over the
// survivors, exactly, as every step after it.
TEST_F(Elastic, GradientAllreduceGoesOnWithoutAKilledMemberAt4) {
  expect_survived(train_with_a_kill(server_.port(), 4, "elastic-ga4", make_gradient_allreduce),
                  true);
}
TEST_F(Elastic, GradientAllreduceGoesOnWithoutAKilledMemberAt3) {
  expect_survived(train_with_a_kill(server_.port(), 3, "elastic-ga3", make_gradient_allreduce),
                  true);
}

// bytegrad with error feedback (8 bits): within the codec's error, and the
// survivors agree bit for bit.
TEST_F(Elastic, BytegradWithErrorFeedbackGoesOnWithoutAKilledMember) {
  expect_survived(train_with_a_kill(server_.port(), 4, "elastic-bg4", make_bytegrad), false);
}

// The last member dies at a random moment (from a thread of its own) while
// the others train many short steps, so that it dies in every part of a
// step across runs: inside a bucket's allreduce, in the unused-tensor
// agreement, in the commit. Every survivor reports, per step, whether its
// results are the exact average over all members or over the survivors;
// the reports must be the same on every survivor (no step mixes views, no
// survivor applies a step the others ran again), all members' averages
// before the change and the survivors' after it.
std::vector<ChildRun> train_with_a_random_kill(uint16_t port, int n, const std::string& job,
                                               int kill_after_ms) {
  constexpr int kManySteps = 400;
  std::vector<ChildRun> members;
  for (int r = 0; r < n; ++r)
    members.push_back(fork_child([port, n, r, job, kill_after_ms]() -> std::string {
      auto store = client(port);
      CommunicatorPtr comm = ucx_comm(store, r, n, job);
      Tensors x({3000, 7000});
      const auto& sizes = x.sizes;
      const auto& grads = x.grads;
      ReducerOptions ro;
      ro.elastic = elastic_options(store, n, job);
      ro.plan.cap_bytes = 16 << 10;
      ro.plan.first_cap_bytes = 8 << 10;
      Reducer reducer(comm, x.specs, make_gradient_allreduce(), ExecContext::host(), ro);
      if (r == n - 1)
        std::thread([kill_after_ms] {
          std::this_thread::sleep_for(milliseconds(kill_after_ms));
          ::raise(SIGKILL);
        }).detach();
      std::vector<int> everyone, survivors;
      for (int m = 0; m < n; ++m) {
        everyone.push_back(m);
        if (m < n - 1) survivors.push_back(m);
      }
      std::ostringstream out;
      for (int s = 0; s < kManySteps; ++s) {
        x.fill(r, s);
        std::this_thread::sleep_for(milliseconds(1));  // compute
        reducer.begin_step();
        x.mark_all(reducer);
        reducer.synchronize();
        const auto over = [&](const std::vector<int>& m) {
          for (size_t t = 0; t < sizes.size(); ++t)
            for (int64_t i = 0; i < sizes[t]; ++i)
              if (grads[t][static_cast<size_t>(i)] != average(m, s, static_cast<int>(t), i))
                return false;
          return true;
        };
        out << (over(everyone) ? "all" : over(survivors) ? "survivors" : "wrong") << "\n";
      }
      out << reducer.view().describe();
      return out.str();
    }));
  test::collect_children(members, kCollectTimeout);
  return members;
}

TEST_F(Elastic, SurvivorsAgreeOnEveryStepWhenAMemberDiesAtARandomMoment) {
  std::mt19937 random(std::random_device{}());
  for (int run = 0; run < 6; ++run) {
    const int kill_after_ms = std::uniform_int_distribution<int>(50, 400)(random);
    const auto members = train_with_a_random_kill(
        server_.port(), 4, "elastic-random" + std::to_string(run), kill_after_ms);
    SCOPED_TRACE("killed after " + std::to_string(kill_after_ms) + " ms");
    EXPECT_TRUE(WIFSIGNALED(members[3].status) && WTERMSIG(members[3].status) == SIGKILL);
    for (int r = 0; r < 3; ++r) {
      const ChildRun& c = members[static_cast<size_t>(r)];
      ASSERT_TRUE(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)
          << "member " << r << ": " << c.text;
      EXPECT_EQ(c.text, members[0].text) << "member " << r << " and member 0 differ";
      const size_t first = c.text.find("survivors");
      ASSERT_NE(first, std::string::npos) << c.text;
      EXPECT_EQ(c.text.find("wrong"), std::string::npos) << c.text;
      EXPECT_EQ(c.text.find("all", first), std::string::npos) << "a step over all members after "
                                                                 "the survivors' first: "
                                                              << c.text;
      EXPECT_NE(c.text.find("epoch 1 {0,1,2}"), std::string::npos) << c.text;
    }
  }
}

// What an elastic Reducer refuses, on every rank, before it communicates:
// bucket views, an algorithm that does not survive a view change (local
// SGD, hierarchical gradient allreduce), no store, a view of another size,
// bucket tuning.
// ---- newcomers ----

constexpr int kAdmitAfter = 2;  // members admit the newcomer at this step's end

// A member's application state: the next step, the parameters and the
// optimizer's state (the same bytes on every member that trained alike).
std::vector<uint8_t> save_app(int next_step, const Tensors& x, const Optimizer& opt) {
  std::vector<uint8_t> out(sizeof(int32_t));
  std::memcpy(out.data(), &next_step, sizeof(int32_t));
  for (const auto& p : x.params) {
    const auto* b = reinterpret_cast<const uint8_t*>(p.data());
    out.insert(out.end(), b, b + p.size() * sizeof(float));
  }
  for (std::byte b : opt.state_dict().serialize()) out.push_back(static_cast<uint8_t>(b));
  return out;
}

void load_app(const std::vector<uint8_t>& in, int& next_step, Tensors& x, Optimizer& opt) {
  size_t at = sizeof(int32_t);
  std::memcpy(&next_step, in.data(), sizeof(int32_t));
  for (auto& p : x.params) {
    std::memcpy(p.data(), in.data() + at, p.size() * sizeof(float));
    at += p.size() * sizeof(float);
  }
  std::vector<std::byte> dict(in.size() - at);
  std::memcpy(dict.data(), in.data() + at, dict.size());
  opt.load_state_dict(StateDict::deserialize(dict));
}

// FNV-1a of every parameter's bytes.
uint64_t params_hash(const Tensors& x) {
  Fnv1a h;
  for (const auto& p : x.params)
    h.bytes(std::string_view(reinterpret_cast<const char*>(p.data()), p.size() * sizeof(float)));
  return h.value();
}

// Three members train kSteps steps of SGD with momentum over `make`'s
// algorithm; a fourth process joins. Rank 0 waits for its ticket before step
// kAdmitAfter (so the admission comes at that step's end). With `diverge`,
// member 2's parameters differ from the others' at the admission: it is
// resynced. Each process reports per step its view and the largest error of
// its averaged gradients against the exact average over that view, then the
// hash of its final parameters.
std::vector<ChildRun> train_with_a_newcomer(uint16_t port, const std::string& job,
                                            AlgorithmPtr (*make)(), bool diverge,
                                            bool averages = true) {
  const auto body = [port, job, make, diverge, averages](int r) -> std::string {
    auto store = client(port);
    Tensors x(kSizes);
    SgdOptions so;
    so.lr = 1e-7f;
    so.momentum = 0.9f;
    Sgd sgd(so);
    int next_step = 0;
    ReducerOptions ro;
    ro.elastic = elastic_options(store, 3, job);
    ElasticOptions& e = *ro.elastic;
    e.admit = true;
    e.admission_interval = milliseconds(0);
    e.save_state = [&] { return save_app(next_step, x, sgd); };
    e.load_state = [&](const std::vector<uint8_t>& bytes) { load_app(bytes, next_step, x, sgd); };
    CommunicatorPtr comm;
    if (r < 3) {
      comm = ucx_comm(store, r, 3, job);
    } else {
      store->wait({job + "/come"}, milliseconds(20000));
      ViewChangeResult admitted = join(e.view_change, milliseconds(20000));
      comm = std::move(admitted.comm);
      e.view = std::move(admitted.view);
      e.newcomer = true;
    }
    ro.plan.cap_bytes = 8 << 10;
    ro.plan.first_cap_bytes = 4 << 10;
    Reducer reducer(comm, x.specs, make(), ExecContext::host(), ro);
    std::ostringstream out;
    for (int s = next_step; s < kSteps; ++s) {
      const int self = reducer.view().members[static_cast<size_t>(reducer.communicator()->rank())];
      x.fill(self, s);
      if (r == 0 && s == kAdmitAfter) {
        store->set(job + "/come", {1});
        while (pending_joiners(e.view_change) < 1) std::this_thread::sleep_for(milliseconds(5));
      }
      reducer.begin_step();
      x.mark_all(reducer);
      reducer.synchronize();
      const MembershipView view = reducer.view();
      double worst = 0;
      for (size_t t = 0; averages && t < kSizes.size(); ++t)
        for (int64_t i = 0; i < kSizes[t]; ++i) {
          const double want = average(view.members, s, static_cast<int>(t), i);
          const double got = x.grads[t][static_cast<size_t>(i)];
          worst = std::max(worst, std::abs(got - want) / std::max(1.0, std::abs(want)));
        }
      out << "step " << s << ": " << view.describe() << " error "
          << (worst == 0     ? "0"
              : worst < 0.02 ? "<2%"
                             : "LARGE(" + std::to_string(worst) + ")")
          << "\n";
      if (diverge && r == 2 && s == kAdmitAfter) x.params[0][0] += 1.0f;
      next_step = s + 1;
      reducer.optimizer_step(sgd);
    }
    out << "params " << params_hash(x);
    return out.str();
  };
  std::vector<ChildRun> runs;
  for (int r = 0; r < 4; ++r) runs.push_back(fork_child([body, r] { return body(r); }));
  test::collect_children(runs, kCollectTimeout);
  return runs;
}

// Every process's report: three members up to the admission, four after it
// (the newcomer from its first step), exact (or within 2%) averages, and the
// same final parameters everywhere.
// `params` (when given) gets the final parameters' line.
void expect_admitted(const std::vector<ChildRun>& runs, bool exact,
                     std::string* params_out = nullptr) {
  std::string params;
  for (int r = 0; r < 4; ++r) {
    const ChildRun& c = runs[static_cast<size_t>(r)];
    ASSERT_TRUE(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)
        << "process " << r << ": " << c.text;
    std::istringstream lines(c.text);
    std::string line;
    for (int s = r < 3 ? 0 : kAdmitAfter + 1; s < kSteps; ++s) {
      ASSERT_TRUE(std::getline(lines, line)) << c.text;
      const std::string want = "step " + std::to_string(s) + ": " +
                               (s <= kAdmitAfter ? "epoch 0 {0,1,2}" : "epoch 1 {0,1,2,3}") +
                               " error ";
      if (exact)
        EXPECT_EQ(line, want + "0") << "process " << r;
      else
        EXPECT_TRUE(line == want + "0" || line == want + "<2%") << "process " << r << ": " << line;
    }
    ASSERT_TRUE(std::getline(lines, line)) << c.text;
    if (params.empty()) params = line;
    EXPECT_EQ(line, params) << "process " << r << " ends with other parameters than process 0";
  }
  if (params_out != nullptr) *params_out = params;
}

TEST_F(Elastic, ANewcomerIsAdmittedWithTheTrainingState) {
  expect_admitted(train_with_a_newcomer(server_.port(), "admit-ga", make_gradient_allreduce, false),
                  true);
}

// Member 2's parameters differ at the admission: the state sync resyncs it
// with the newcomer, so all four end alike.
TEST_F(Elastic, AMemberWhoseStateDiffersIsResynced) {
  std::string plain, resynced;
  expect_admitted(
      train_with_a_newcomer(server_.port(), "admit-plain", make_gradient_allreduce, false), true,
      &plain);
  expect_admitted(
      train_with_a_newcomer(server_.port(), "admit-resync", make_gradient_allreduce, true), true,
      &resynced);
  // The members' state won, not member 2's.
  EXPECT_EQ(resynced, plain);
}

// Q-Adam's moments are replicated state: the newcomer receives them, and its
// steps after the admission are bit-identical to the members'.
TEST_F(Elastic, QAdamNewcomerReceivesTheMoments) {
  // Q-Adam's buckets carry its momentum, not the averaged gradients: only
  // the views and the final parameters are compared.
  expect_admitted(train_with_a_newcomer(server_.port(), "admit-qadam", make_qadam, false, false),
                  true);
}

TEST_F(Elastic, RefusesWhatCannotChangeViews) {
  std::vector<ChildRun> members;
  members.push_back(fork_child([port = server_.port()]() -> std::string {
    auto store = client(port);
    CommunicatorPtr comm = ucx_comm(store, 0, 1, "elastic-refuse");
    std::vector<float> g(10), p(10);
    std::vector<TensorSpec> specs = {
        {"g", TensorView::host(g.data(), 10), TensorRole::gradient, 1},
        {"p", TensorView::host(p.data(), 10), TensorRole::parameter, -1}};
    std::ostringstream out;
    const auto attempt = [&](const char* what, ReducerOptions o, AlgorithmPtr a) {
      try {
        Reducer reducer(comm, specs, std::move(a), ExecContext::host(), o);
        out << what << ": accepted\n";
      } catch (const InvalidArgument&) {
        out << what << ": InvalidArgument\n";
      } catch (const Unsupported&) {
        out << what << ": Unsupported\n";
      } catch (const Error& e) {
        out << what << ": " << e.what() << "\n";
      }
    };
    ReducerOptions good;
    good.elastic = elastic_options(store, 1, "elastic-refuse");
    ReducerOptions views = good;
    views.gradient_as_bucket_view = true;
    attempt("bucket views", views, make_gradient_allreduce());
    attempt("local_sgd", good, std::make_shared<algorithms::LocalSgd>());
    ReducerOptions no_store = good;
    no_store.elastic->view_change.store = nullptr;
    attempt("no store", no_store, make_gradient_allreduce());
    ReducerOptions wide = good;
    wide.elastic->view.members.push_back(1);
    attempt("view of 2", wide, make_gradient_allreduce());
    ReducerOptions tuned = good;
    tuned.auto_tune_buckets = true;
    attempt("bucket tuning", tuned, make_gradient_allreduce());
    algorithms::GradientAllreduceOptions h;
    h.hierarchical = true;
    attempt("hierarchical", good, std::make_shared<algorithms::GradientAllreduce>(h));
    attempt("good", good, make_gradient_allreduce());
    return out.str();
  }));
  test::collect_children(members, kCollectTimeout);
  ASSERT_TRUE(WIFEXITED(members[0].status) && WEXITSTATUS(members[0].status) == 0);
  EXPECT_EQ(members[0].text,
            "bucket views: InvalidArgument\nlocal_sgd: Unsupported\nno store: "
            "InvalidArgument\nview of 2: InvalidArgument\nbucket tuning: InvalidArgument\n"
            "hierarchical: Unsupported\ngood: accepted\n");
}

}  // namespace
}  // namespace relaxcc
