// Every algorithm module on the convergence harness (convergence_harness.h):
// success within its step budget against gradient_allreduce measured in the
// same test, checkpoints that resume bit for bit, and bad configurations.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <tuple>

#include <gtest/gtest.h>

#include "convergence_harness.h"
#include "relaxcc/algorithms/async_model_average.h"
#include "relaxcc/algorithms/bytegrad.h"
#include "relaxcc/algorithms/cocktail_sgd.h"
#include "relaxcc/algorithms/decentralized_sgd.h"
#include "relaxcc/algorithms/diloco.h"
#include "relaxcc/algorithms/gradient_allreduce.h"
#include "relaxcc/algorithms/local_sgd.h"
#include "relaxcc/algorithms/low_precision_decentralized_sgd.h"
#include "relaxcc/algorithms/moshpit_sgd.h"
#include "relaxcc/algorithms/qadam.h"
#include "relaxcc/errors.h"
#include "relaxcc/tunables.h"

namespace relaxcc::test {
namespace {

using namespace algorithms;

const LeastSquares& problem() {
  static const LeastSquares p;
  return p;
}

ScheduledOptimizer::Factory sgd() {
  return [](float lr) { return std::make_unique<Sgd>(SgdOptions{lr}); };
}
ScheduledOptimizer::Factory adam() {
  return [](float lr) {
    AdamOptions o;
    o.lr = lr;
    return std::make_unique<Adam>(o);
  };
}

// Plain gradient descent from lr0 = 1 / L.
Trial sgd_trial(std::string name, std::function<AlgorithmPtr()> algorithm) {
  Trial t;
  t.name = std::move(name);
  t.algorithm = std::move(algorithm);
  t.optimizer = sgd();
  t.lr0 = static_cast<float>(1.0 / problem().lipschitz());
  return t;
}

constexpr float kAdamLr = 0.05f;

Trial adam_trial(std::string name, std::function<AlgorithmPtr()> algorithm) {
  Trial t;
  t.name = std::move(name);
  t.algorithm = std::move(algorithm);
  t.optimizer = adam();
  t.lr0 = kAdamLr;
  return t;
}

Trial qadam_trial(std::string name, QAdamOptions o) {
  Trial t = adam_trial(std::move(name), [o] { return std::make_shared<QAdam>(o); });
  t.set_lr = [](Algorithm& a, float lr) { a.set_learning_rate(lr); };
  return t;
}

// cocktail_sgd's sparsest setting that passes here (docs/algorithms.md):
// the whole random fifth at 2 bits in chunks of 2048 (the harness cannot
// tell the chunk: its shards keep 16-32 values), no index on the wire;
// `packed`: with pack_payloads (the same trajectory).
CocktailSgdOptions sparse_cocktail(bool packed = false) {
  CocktailSgdOptions o = CocktailSgdOptions::sparse();
  o.pack_payloads = packed;
  return o;
}

ByteGradOptions flat_bytegrad() {
  ByteGradOptions o;
  o.hierarchical = false;
  return o;
}

// Runs the baseline, then every trial within `multiple` times its steps, and
// prints the table on rank 0.
void expect_within_budget(const Trial& baseline,
                          const std::vector<std::pair<Trial, double>>& trials) {
  const RunResult base = run(problem(), baseline, 40000);
  ASSERT_GT(base.steps, 0) << baseline.name << " never converged: error " << base.error
                           << ", consensus " << base.consensus;
  if (world_rank() == 0)
    std::printf("[convergence] %d ranks, condition %.1f: %-28s %6lld steps (the baseline)\n",
                world_size(), problem().condition(), baseline.name.c_str(),
                static_cast<long long>(base.steps));
  for (const auto& [trial, multiple] : trials) {
    const int64_t budget = static_cast<int64_t>(multiple * static_cast<double>(base.steps));
    const RunResult r = run(problem(), trial, budget);
    if (world_rank() == 0)
      std::printf(
          "[convergence] %-40s %6lld steps (%.2fx, budget %.0fx): error %.2e, consensus %.2e\n",
          trial.name.c_str(), static_cast<long long>(r.steps),
          static_cast<double>(r.steps) / static_cast<double>(base.steps), multiple, r.error,
          r.consensus);
    EXPECT_GT(r.steps, 0) << trial.name << " missed its budget of " << budget << " steps: error "
                          << r.error << ", consensus " << r.consensus;
  }
}

TEST(Convergence, ProblemIsConditioned) {
  const double c = problem().condition();
  if (world_rank() == 0) std::printf("[convergence] Hessian condition number %.1f\n", c);
  EXPECT_GE(c, 50.0);
  EXPECT_LE(c, 200.0);
}

TEST(Convergence, SgdAlgorithmsWithinBudget) {
  std::vector<std::pair<Trial, double>> trials;
  trials.push_back({sgd_trial("bytegrad (flat, 8-bit)",
                              [] { return std::make_shared<ByteGrad>(flat_bytegrad()); }),
                    2.0});
  trials.push_back(
      {sgd_trial("bytegrad (defaults: hierarchical)", [] { return std::make_shared<ByteGrad>(); }),
       2.0});
  trials.push_back(
      {sgd_trial("cocktail_sgd (defaults)", [] { return std::make_shared<CocktailSgd>(); }), 2.0});
  // Success asks the error of the ranks' mean model only (its consensus is
  // reported): at 4 ranks what each rank's payloads missed keeps the models
  // apart by more than the tolerance; average_model() closes that gap before
  // evaluation.
  Trial sparse = sgd_trial("cocktail_sgd (random 0.2, top-k 1, 2-bit)",
                           [] { return std::make_shared<CocktailSgd>(sparse_cocktail()); });
  sparse.averaged_for_evaluation = true;
  trials.push_back({sparse, 2.0});
  Trial packed = sgd_trial("cocktail_sgd (random 0.2, top-k 1, 2-bit, packed payloads)",
                           [] { return std::make_shared<CocktailSgd>(sparse_cocktail(true)); });
  packed.averaged_for_evaluation = true;
  trials.push_back({packed, 2.0});
  trials.push_back(
      {sgd_trial("local_sgd (period 4)", [] { return std::make_shared<LocalSgd>(); }), 4.0});
  expect_within_budget(
      sgd_trial("gradient_allreduce + SGD", [] { return std::make_shared<GradientAllreduce>(); }),
      trials);
}

TEST(Convergence, AdamAlgorithmsWithinBudget) {
  std::vector<std::pair<Trial, double>> trials;
  trials.push_back({qadam_trial("qadam (defaults: 8-bit min-max)", QAdamOptions{}), 2.0});
  QAdamOptions two_bits;
  two_bits.bits = 2;
  trials.push_back({qadam_trial("qadam (2-bit min-max)", two_bits), 2.0});
  // Most steps compressed: the baseline takes little more than the default
  // warmup.
  QAdamOptions short_warmup;
  short_warmup.warmup_steps = 20;
  trials.push_back({qadam_trial("qadam (8-bit min-max, warmup 20)", short_warmup), 2.0});
  // Not held to the budget: the sign codec (1-bit Adam), which scales each
  // chunk by ||m|| / sqrt(len) as DeepSpeed does. With momenta whose
  // magnitudes spread over a chunk that is no contraction, and the error
  // feedback grows: on this problem it diverges with the default chunk of
  // 2048 and misses the budget at 4 ranks with chunks of 4
  // (docs/algorithms.md). Its checkpoints are tested below.
  expect_within_budget(
      adam_trial("gradient_allreduce + Adam", [] { return std::make_shared<GradientAllreduce>(); }),
      trials);
}

// qadam's warmup is Adam: the same trajectory as gradient_allreduce with
// relaxcc::Adam, L2 or decoupled (AdamW) weight decay, up to f32 rounding.
TEST(QAdam, WarmupIsAdam) {
  for (bool decoupled : {false, true}) {
    AdamOptions a;
    a.weight_decay = 0.01f;
    a.decoupled_weight_decay = decoupled;
    Trial adam = adam_trial("gradient_allreduce + Adam",
                            [] { return std::make_shared<GradientAllreduce>(); });
    adam.optimizer = [a](float lr) {
      AdamOptions o = a;
      o.lr = lr;
      return std::make_unique<Adam>(o);
    };
    QAdamOptions q;
    q.adam = a;
    q.warmup_steps = 1000;
    const Trial qadam = qadam_trial("qadam", q);
    Training reference(problem(), adam, adam.algorithm());
    Training warming(problem(), qadam, qadam.algorithm());
    for (int i = 0; i < 50; ++i) {
      reference.step();
      warming.step();
    }
    double diff = 0, norm = 0;
    for (int j = 0; j < kFeatures; ++j) {
      diff = std::max(diff, std::abs(double(reference.x()[j]) - warming.x()[j]));
      norm = std::max(norm, std::abs(double(reference.x()[j])));
    }
    EXPECT_LE(diff, 1e-5 * norm) << "decoupled " << decoupled;
    EXPECT_GT(norm, 0.1);
  }
}

// A run checkpointed at `save_at` ends bit for bit where the straight run
// to `steps` ends, and the runs moved (not two zero models).
void expect_resumes_bit_for_bit(const Trial& t, int64_t save_at, int64_t steps) {
  const auto [straight, resumed] = checkpoint_roundtrip(problem(), t, save_at, steps);
  ASSERT_EQ(straight.size(), resumed.size());
  EXPECT_EQ(std::memcmp(straight.data(), resumed.data(), straight.size() * sizeof(float)), 0)
      << t.name << " left the trajectory after a checkpoint";
  double norm = 0;
  for (float v : straight) norm += static_cast<double>(v) * v;
  EXPECT_GT(norm, 1.0) << t.name;
}

// Packing is lossless: cocktail_sgd with packed payloads follows the
// trajectory of the same setting without, bit for bit, on every rank.
TEST(Convergence, PackedCocktailFollowsTheSameTrajectory) {
  const Trial plain_trial = sgd_trial("cocktail_sgd (random 0.2, top-k 1, 2-bit)", [] {
    return std::make_shared<CocktailSgd>(sparse_cocktail());
  });
  const Trial packed_trial = sgd_trial("cocktail_sgd (packed payloads)", [] {
    return std::make_shared<CocktailSgd>(sparse_cocktail(true));
  });
  const auto train = [](const Trial& trial) {
    Training t(problem(), trial, trial.algorithm());
    while (t.steps() < 300) t.step();
    EXPECT_EQ(dynamic_cast<CocktailSgd&>(t.module()).exchanges(), 300) << trial.name;
    t.reducer().algorithm().shutdown(std::chrono::seconds(60));
    return t.x();
  };
  const std::vector<float> plain = train(plain_trial), with_packing = train(packed_trial);
  ASSERT_EQ(plain.size(), with_packing.size());
  EXPECT_EQ(std::memcmp(plain.data(), with_packing.data(), plain.size() * sizeof(float)), 0)
      << "rank " << world()->rank() << ": packed payloads changed the model";
}

// A peer that never starts its exchange: the packed exchange's wait names
// the stage and times out within the timeout given (poisoning the group, so
// the peers learn it too), and the instance refuses further steps and
// checkpoints, since the ranks' synchronised models may now differ.
TEST(Convergence, PackedCocktailTimesOutOnAPeerThatNeverComes) {
  if (world_size() < 2) GTEST_SKIP() << "needs a peer";
  const Trial trial = sgd_trial("cocktail_sgd (packed payloads)", [] {
    return std::make_shared<CocktailSgd>(sparse_cocktail(true));
  });
  Training t(problem(), trial, trial.algorithm());
  for (int i = 0; i < 5; ++i) t.step();
  auto& cocktail = dynamic_cast<CocktailSgd&>(t.module());
  if (world()->rank() == 0) {
    t.step();  // its exchange waits for the others' sizes, which never come
    const auto start = std::chrono::steady_clock::now();
    try {
      cocktail.drain(std::chrono::milliseconds(300));
      ADD_FAILURE() << "drain completed without the peers";
    } catch (const Timeout& e) {
      EXPECT_NE(std::string(e.what()).find("cocktail_sgd step 5 sizes to owners"),
                std::string::npos)
          << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    EXPECT_THROW(cocktail.state_dict(), CommunicationError);
    EXPECT_THROW(t.step(), CommunicationError);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  t.reducer().algorithm().shutdown(std::chrono::seconds(10));
}

// Every algorithm with every piece of state in use at the checkpoint: error
// feedback on, warmup over, an exchange unapplied, a period half done.
TEST(Checkpoint, ResumesBitForBit) {
  ByteGradOptions bytegrad = flat_bytegrad();
  bytegrad.error_feedback = true;
  QAdamOptions qadam_minmax;
  qadam_minmax.warmup_steps = 10;
  qadam_minmax.bits = 4;
  QAdamOptions qadam_sign = qadam_minmax;
  qadam_sign.codec = kernels::CompressorKind::sign;
  CocktailSgdOptions cocktail;
  cocktail.warmup_steps = 5;
  cocktail.rounding = kernels::Rounding::stochastic;
  const std::vector<Trial> trials{
      sgd_trial("gradient_allreduce", [] { return std::make_shared<GradientAllreduce>(); }),
      sgd_trial("bytegrad with error feedback",
                [bytegrad] { return std::make_shared<ByteGrad>(bytegrad); }),
      // Quantizes across nodes in the two_nodes run (error feedback on the
      // leaders only).
      sgd_trial("hierarchical bytegrad with error feedback",
                [] {
                  ByteGradOptions o;
                  o.error_feedback = true;
                  return std::make_shared<ByteGrad>(o);
                }),
      sgd_trial("cocktail_sgd", [cocktail] { return std::make_shared<CocktailSgd>(cocktail); }),
      sgd_trial("cocktail_sgd (random 0.2, top-k 1, 2-bit)",
                [] { return std::make_shared<CocktailSgd>(sparse_cocktail()); }),
      sgd_trial("cocktail_sgd (random 0.2, top-k 1, 2-bit, packed payloads)",
                [] { return std::make_shared<CocktailSgd>(sparse_cocktail(true)); }),
      sgd_trial("local_sgd",
                [] {
                  return std::make_shared<LocalSgd>(LocalSgdOptions{4, 3});
                }),
      qadam_trial("qadam min-max", qadam_minmax),
      qadam_trial("qadam sign", qadam_sign),
  };
  for (const Trial& t : trials) expect_resumes_bit_for_bit(t, 30, 50);
}

template <typename F>
void expect_invalid(F make, const std::string& mentions) {
  try {
    make();
    ADD_FAILURE() << "no InvalidArgument; expected one about " << mentions;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(mentions), std::string::npos) << e.what();
  }
}

TEST(Config, BadConfigurationIsInvalidArgument) {
  for (int bits : {0, 3, 9, -1}) {
    expect_invalid([bits] { ByteGrad(ByteGradOptions{bits}); }, "bytegrad: bits");
    expect_invalid(
        [bits] {
          QAdamOptions o;
          o.bits = bits;
          QAdam q(o);
        },
        "qadam: bits");
    expect_invalid(
        [bits] {
          CocktailSgdOptions o;
          o.bits = bits;
          CocktailSgd c(o);
        },
        "cocktail_sgd: bits");
  }
  for (double ratio : {0.0, -0.1, 1.5}) {
    expect_invalid(
        [ratio] {
          CocktailSgdOptions o;
          o.random_ratio = ratio;
          CocktailSgd c(o);
        },
        "random_ratio");
    expect_invalid(
        [ratio] {
          CocktailSgdOptions o;
          o.topk_ratio = ratio;
          CocktailSgd c(o);
        },
        "topk_ratio");
  }
  expect_invalid(
      [] {
        QAdamOptions o;
        o.warmup_steps = -1;
        QAdam q(o);
      },
      "warmup_steps");
  expect_invalid(
      [] {
        CocktailSgdOptions o;
        o.warmup_steps = -1;
        CocktailSgd c(o);
      },
      "warmup_steps");
  expect_invalid([] { LocalSgd l(LocalSgdOptions{4, -1}); }, "warmup_steps");
  expect_invalid(
      [] {
        QAdamOptions o;
        o.codec = kernels::CompressorKind::topk;
        QAdam q(o);
      },
      "qadam: codec");
  // The boundaries are accepted.
  CocktailSgdOptions edge;
  edge.random_ratio = 1.0;
  edge.topk_ratio = 1.0;
  edge.bits = 1;
  EXPECT_NO_THROW(CocktailSgd{edge});
  EXPECT_NO_THROW(ByteGrad(ByteGradOptions{1}));
}

// The decentralized, asynchronous and DiLoCo modules: weights (or
// pseudo-gradients) travel, not gradients.
DecentralizedSgdOptions gossip_options(GossipMode mode, int tag) {
  DecentralizedSgdOptions o;
  o.mode = mode;
  o.tag = tag;
  return o;
}

template <typename Module, typename Options>
std::function<AlgorithmPtr()> make(Options o) {
  return [o] { return std::make_shared<Module>(o); };
}

TEST(Decentralized, WithinBudget) {
  std::vector<std::pair<Trial, double>> trials;
  trials.push_back({sgd_trial("decentralized_sgd (defaults: all)",
                              make<DecentralizedSgd>(DecentralizedSgdOptions{})),
                    2.0});
  for (GossipMode mode : {GossipMode::shift_one, GossipMode::exponential})
    trials.push_back({sgd_trial("decentralized_sgd (" + std::string(gossip_mode_name(mode)) + ")",
                                make<DecentralizedSgd>(gossip_options(mode, 31000))),
                      2.0});
  // The ring's W has eigenvalue -1/3 at 4 ranks: W - lr H is unstable at
  // lr = 1 / L, I + 0.8 (W - I) is not (docs/algorithms.md).
  DecentralizedSgdOptions ring = gossip_options(GossipMode::ring, 31000);
  ring.consensus_step = 0.8;
  trials.push_back(
      {sgd_trial("decentralized_sgd (ring, consensus step 0.8)", make<DecentralizedSgd>(ring)),
       2.0});
  trials.push_back(
      {sgd_trial("low_precision_decentralized_sgd (defaults: 8-bit)",
                 make<LowPrecisionDecentralizedSgd>(LowPrecisionDecentralizedSgdOptions{})),
       2.0});
  trials.push_back({sgd_trial("moshpit_sgd (defaults: adaptive deadline)",
                              make<MoshpitSgd>(MoshpitSgdOptions{})),
                    2.0});
  MoshpitSgdOptions waiting;
  waiting.deadline = RoundDeadlineOptions{};
  waiting.tag = 33500;
  trials.push_back({sgd_trial("moshpit_sgd (no deadline)", make<MoshpitSgd>(waiting)), 2.0});
  trials.push_back({sgd_trial("async_model_average (defaults)",
                              make<AsyncModelAverage>(AsyncModelAverageOptions{})),
                    4.0});
  expect_within_budget(
      sgd_trial("gradient_allreduce + SGD", [] { return std::make_shared<GradientAllreduce>(); }),
      trials);
}

// Each module's final exact average leaves every rank with the same model.
TEST(Decentralized, AverageModelIsExact) {
  const std::vector<Trial> trials{
      sgd_trial("decentralized_sgd exponential",
                make<DecentralizedSgd>(gossip_options(GossipMode::exponential, 31000))),
      sgd_trial("low_precision_decentralized_sgd",
                make<LowPrecisionDecentralizedSgd>(LowPrecisionDecentralizedSgdOptions{})),
      sgd_trial("moshpit_sgd", make<MoshpitSgd>(MoshpitSgdOptions{})),
      sgd_trial("async_model_average", make<AsyncModelAverage>(AsyncModelAverageOptions{})),
      sgd_trial("cocktail_sgd", make<CocktailSgd>(sparse_cocktail())),
  };
  for (const Trial& trial : trials) {
    Training t(problem(), trial, trial.algorithm());
    for (int i = 0; i < 7; ++i) t.step();
    if (auto* w = dynamic_cast<WeightRounds*>(&t.module())) w->average_model();
    if (auto* a = dynamic_cast<AsyncModelAverage*>(&t.module())) a->average_model();
    if (auto* c = dynamic_cast<CocktailSgd*>(&t.module())) c->average_model();
    const auto [error, consensus] = problem().errors(t.x().data());
    EXPECT_EQ(consensus, 0.0) << trial.name;
    EXPECT_LT(error, 1.0) << trial.name;
    t.reducer().algorithm().shutdown(std::chrono::seconds(60));
  }
}

TEST(Decentralized, CheckpointResumesBitForBit) {
  LowPrecisionDecentralizedSgdOptions four_bits;
  four_bits.codec.bits = 4;
  four_bits.communication_interval = 2;
  MoshpitSgdOptions moshpit;  // no deadline: a deterministic trajectory
  moshpit.deadline = RoundDeadlineOptions{};
  moshpit.local_steps = 3;
  DecentralizedSgdOptions shift = gossip_options(GossipMode::shift_one, 31000);
  shift.communication_interval = 3;
  const std::vector<Trial> trials{
      sgd_trial("decentralized_sgd shift_one, interval 3", make<DecentralizedSgd>(shift)),
      sgd_trial("low_precision_decentralized_sgd 4-bit, interval 2",
                make<LowPrecisionDecentralizedSgd>(four_bits)),
      sgd_trial("moshpit_sgd, 3 local steps", make<MoshpitSgd>(moshpit)),
  };
  for (const Trial& t : trials) expect_resumes_bit_for_bit(t, 31, 50);
}

// async_model_average is not reproducible bit for bit: after a checkpoint
// at step 100 it still converges within its budget.
TEST(Decentralized, AsyncConvergesAfterResume) {
  const Trial trial =
      sgd_trial("async_model_average", make<AsyncModelAverage>(AsyncModelAverageOptions{}));
  const Trial base =
      sgd_trial("gradient_allreduce + SGD", [] { return std::make_shared<GradientAllreduce>(); });
  const RunResult b = run(problem(), base, 40000);
  ASSERT_GT(b.steps, 0);
  const std::unique_ptr<Training> t = checkpointed(problem(), trial, 100);
  const int64_t budget = 4 * b.steps;
  const RunResult r = train_until(problem(), trial, *t, budget);
  t->module().shutdown(std::chrono::seconds(60));
  if (world_rank() == 0)
    std::printf("[convergence] async_model_average resumed at 100: %lld steps (budget %lld)\n",
                static_cast<long long>(r.steps), static_cast<long long>(budget));
  EXPECT_GT(r.steps, 0) << "error " << r.error << ", consensus " << r.consensus;
}

// One rank of 4 computes 3x slower (sleeps of 3 ms against 1 ms per step):
// with deadlines the others go on without it in the rounds it misses (local
// steps run no collective of the Reducer's own, so nothing else holds them
// back between the harness's checks every kCheckEvery steps), and the run
// still converges within 8x gradient_allreduce's steps: error within
// kStragglerTolerance = 6e-3, consensus within kStragglerConsensus = 2e-3
// (twice the harness's: how many rounds miss the straggler, and so how far
// its model drifts, depends on the machine's load). The rounds that leave the
// straggler out (about a fifth of all peer slots here) underweight its
// shard, which biases the fixed point towards the other shards' optimum:
// the error levels off at 3.6-4.2e-3 from 2x to 8x the steps while the
// consensus keeps shrinking with the learning rate (docs/algorithms.md).
TEST(Decentralized, StragglerWithDeadlines) {
  if (world_size() != 4) GTEST_SKIP() << "a straggler among 4 ranks";
  const Trial base =
      sgd_trial("gradient_allreduce + SGD", [] { return std::make_shared<GradientAllreduce>(); });
  const RunResult b = run(problem(), base, 40000);
  ASSERT_GT(b.steps, 0);
  DecentralizedSgdOptions gossip = gossip_options(GossipMode::shift_one, 35000);
  gossip.deadline.adaptive = true;
  MoshpitSgdOptions moshpit;
  moshpit.tag = 35500;
  const std::vector<Trial> trials{
      sgd_trial("decentralized_sgd shift_one, adaptive deadline", make<DecentralizedSgd>(gossip)),
      sgd_trial("moshpit_sgd, adaptive deadline", make<MoshpitSgd>(moshpit)),
  };
  for (const Trial& trial : trials) {
    Training t(problem(), trial, trial.algorithm());
    const auto compute = std::chrono::milliseconds(world_rank() == 3 ? 3 : 1);
    const int64_t budget = 8 * b.steps;
    const RunResult r = train_until(problem(), trial, t, budget,
                                    [compute] { std::this_thread::sleep_for(compute); });
    int64_t missing = dynamic_cast<WeightRounds&>(t.module()).missing_peers();
    MPI_Allreduce(MPI_IN_PLACE, &missing, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    t.module().shutdown(std::chrono::seconds(60));
    if (world_rank() == 0)
      std::printf(
          "[convergence] straggler: %-48s %6lld steps (budget %lld), error %.2e, consensus "
          "%.2e, peers left out %lld\n",
          trial.name.c_str(), static_cast<long long>(r.steps), static_cast<long long>(budget),
          r.error, r.consensus, static_cast<long long>(missing));
    constexpr double kStragglerTolerance = 6e-3, kStragglerConsensus = 2e-3;
    EXPECT_TRUE(r.steps > 0 ||
                (r.error <= kStragglerTolerance && r.consensus <= kStragglerConsensus))
        << trial.name << ": error " << r.error << ", consensus " << r.consensus;
  }
}

TEST(Decentralized, BadConfigurationIsInvalidArgument) {
  expect_invalid(
      [] {
        DecentralizedSgdOptions o;
        o.communication_interval = 0;
        DecentralizedSgd d(o);
      },
      "communication interval");
  expect_invalid(
      [] {
        DecentralizedSgdOptions o;  // mode all
        o.deadline.fixed = std::chrono::milliseconds(5);
        DecentralizedSgd d(o);
      },
      "takes no deadline");
  expect_invalid(
      [] {
        DecentralizedSgdOptions o;
        o.consensus_step = 0;
        DecentralizedSgd d(o);
      },
      "consensus_step");
  for (double gamma : {0.0, 1.5}) {
    expect_invalid(
        [gamma] {
          LowPrecisionDecentralizedSgdOptions o;
          o.gamma = gamma;
          LowPrecisionDecentralizedSgd d(o);
        },
        "gamma");
  }
  expect_invalid(
      [] {
        LowPrecisionDecentralizedSgdOptions o;
        o.codec.bits = 3;
        LowPrecisionDecentralizedSgd d(o);
      },
      "bits");
  expect_invalid(
      [] {
        MoshpitSgdOptions o;
        o.local_steps = 0;
        MoshpitSgd m(o);
      },
      "communication interval");
  expect_invalid(
      [] {
        MoshpitSgdOptions o;
        o.grid = {2, 0};
        MoshpitSgd m(o);
      },
      "grid dims");
  // A grid that does not fit the ranks fails when the Reducer binds it.
  MoshpitSgdOptions small;
  small.grid = {1};
  expect_invalid(
      [small] {
        const Trial t = sgd_trial("moshpit_sgd", make<MoshpitSgd>(small));
        Training training(problem(), t, t.algorithm());
      },
      "moshpit_sgd: rank");
  for (int64_t staleness : {int64_t{0}, int64_t{-2}}) {
    expect_invalid(
        [staleness] {
          AsyncModelAverageOptions o;
          o.max_staleness_steps = staleness;
          AsyncModelAverage a(o);
        },
        "max_staleness_steps");
  }
}

// diloco with H <= 10, every variant, within 4x gradient_allreduce's steps
// (inner steps counted).
// SparseLoCo's recipe in the budget test at the sparsest density that
// meets the budget at 2 and 4 ranks: 8 of every 64 elements, at H 2 (H 3
// meets it too, with the 4-rank consensus 3% under the tolerance at its
// success; at H 2 every check falls on a sync). The recipe's 2 and 4 of 64
// miss it at every H <= 10, decay and outer lr swept;
// DISABLED_SparseLocoSweep and docs/algorithms.md have the figures.
constexpr int kSparseLocoH = 2;
constexpr double kSparseLocoRatio = 8.0 / 64.0;

// DiLoCo's outer Nesterov 0.7 / 0.9, which the variants below were tuned
// with (plain inner SGD).
DilocoOptions diloco_options(int h) {
  return diloco_paper_options(h);
}

kernels::CompressorConfig minmax_codec(int bits) {
  kernels::CompressorConfig c;
  c.kind = kernels::CompressorKind::minmax;
  c.bits = bits;
  return c;
}

// Every variant at H = 5. Streaming and overlapped variants leave the ranks'
// fragments apart between syncs by design: they are evaluated on the exact
// average (average_model()), the others on every rank's model.
struct DilocoVariant {
  std::string name;
  DilocoOptions options;
  bool averaged = false;
};

std::vector<DilocoVariant> diloco_variants() {
  std::vector<DilocoVariant> v;
  DilocoOptions defaults;
  defaults.inner_steps = 5;
  v.push_back({"diloco (H 5, defaults: outer averaging)", defaults});
  v.push_back({"diloco (H 5, Nesterov 0.7 / 0.9)", diloco_options(5)});
  DilocoOptions fp16 = diloco_options(5);
  fp16.codec = kernels::CompressorConfig{};
  fp16.codec->kind = kernels::CompressorKind::f16;
  v.push_back({"diloco (H 5, fp16)", fp16});
  for (int bits : {8, 4}) {
    DilocoOptions q = diloco_options(5);
    q.codec = minmax_codec(bits);
    v.push_back({"diloco (H 5, " + std::to_string(bits) + "-bit, error feedback)", q});
  }
  // 2 bits with the outer momentum diverge on this problem: outer SGD.
  DilocoOptions two = diloco_options(5);
  two.codec = minmax_codec(2);
  two.outer_momentum = 0;
  v.push_back({"diloco (H 5, 2-bit, error feedback, outer SGD 0.7)", two});
  // Top-k through the sparse allreduce (f32 values), decayed error feedback
  // for momentum, outer lr 1, at 50% density.
  DilocoOptions topk = sparseloco_options(5);
  topk.chunk_topk.reset();
  topk.codec = kernels::CompressorConfig{};
  topk.codec->kind = kernels::CompressorKind::topk;
  topk.codec->ratio = 0.5;
  topk.codec->approximate = false;
  v.push_back({"diloco (H 5, sparse-allreduce top-50%, beta 0.95, outer SGD 1)", topk});
  // SparseLoCo's recipe: chunk-wise top-k of 64-element chunks, 2-bit
  // values, error feedback in place of outer momentum (docs/algorithms.md
  // has the densities that converge on this problem).
  DilocoOptions sparseloco = sparseloco_options(kSparseLocoH);
  sparseloco.chunk_topk->ratio = kSparseLocoRatio;
  v.push_back({"diloco (SparseLoCo: H " + std::to_string(kSparseLocoH) + ", chunk top-" +
                   std::to_string(static_cast<int>(kSparseLocoRatio * 64 + 0.5)) +
                   "/64, 2-bit, beta 0.95, outer SGD 1)",
               sparseloco});
  DilocoOptions streaming = diloco_options(5);
  streaming.fragments = 2;
  streaming.overlap_steps = 2;
  v.push_back({"diloco (H 5, streaming: 2 fragments, overlap 2)", streaming, true});
  // A one-round-delayed outer step stalls near 1.0e-3 at H 5 within the
  // budget (docs/algorithms.md): eager variants run at H 3.
  DilocoOptions eager = diloco_options(3);
  eager.eager = true;
  v.push_back({"diloco (H 3, eager)", eager, true});
  // The harness's plan has 3 buckets: 3 fragments of whole buckets.
  DilocoOptions three = diloco_options(4);
  three.fragments = 3;
  three.overlap_steps = 1;
  three.codec = minmax_codec(4);
  three.hierarchical = true;
  v.push_back({"diloco (H 4, 3 fragments, overlap 1, hierarchical 4-bit)", three, true});
  DilocoOptions all = diloco_options(3);
  all.fragments = 2;
  all.eager = true;
  all.codec = minmax_codec(4);
  all.hierarchical = true;
  v.push_back({"diloco (H 3, 2 fragments, eager, hierarchical 4-bit)", all, true});
  return v;
}

TEST(Diloco, WithinBudget) {
  std::vector<std::pair<Trial, double>> trials;
  for (const DilocoVariant& d : diloco_variants()) {
    Trial t = sgd_trial(d.name, make<Diloco>(d.options));
    t.averaged_for_evaluation = d.averaged;
    trials.push_back({t, 4.0});
  }
  expect_within_budget(
      sgd_trial("gradient_allreduce + SGD", [] { return std::make_shared<GradientAllreduce>(); }),
      trials);
}

ScheduledOptimizer::Factory sgd_momentum() {
  return [](float lr) { return std::make_unique<Sgd>(SgdOptions{.lr = lr, .momentum = 0.9f}); };
}

// The harness error of the averaged model after each of `checks` blocks of
// `every` steps of `trial`.
std::vector<double> errors_every(const Trial& trial, int every, int checks) {
  Training t(problem(), trial, trial.algorithm());
  std::vector<double> errors;
  for (int c = 0; c < checks; ++c) {
    for (int k = 0; k < every; ++k) t.step();
    errors.push_back(problem().errors(t.x().data()).first);
  }
  t.reducer().algorithm().shutdown(std::chrono::seconds(60));
  return errors;
}

// The defaults (outer lr 1, no outer momentum: the outer step averages the
// models; H 5 here, as the variants above) converge whatever the inner
// optimizer: over plain SGD, SGD with momentum 0.9 and Adam, the averaged
// model's error falls at every check of 100 steps (checks fall on syncs)
// and ends under 1e-2 of ||x*|| (from 1 at x = 0). DiLoCo's outer Nesterov
// 0.7 / 0.9 over SGD with momentum or Adam oscillates and grows instead.
TEST(Diloco, DefaultsConvergeOverEveryInnerOptimizer) {
  DilocoOptions defaults;
  defaults.inner_steps = 5;
  const auto lr_sgd = static_cast<float>(1.0 / problem().lipschitz());
  for (const auto& [inner, factory, lr0] :
       {std::tuple{std::string("SGD"), sgd(), lr_sgd},
        std::tuple{std::string("SGD momentum 0.9"), sgd_momentum(), lr_sgd},
        std::tuple{std::string("Adam"), adam(), kAdamLr}}) {
    Trial t;
    t.name = "diloco (defaults, H 5) + " + inner;
    t.algorithm = make<Diloco>(defaults);
    t.optimizer = factory;
    t.lr0 = lr0;
    const std::vector<double> e = errors_every(t, 100, 4);
    if (world_rank() == 0)
      std::printf("[convergence] %-40s error every 100 steps: %.2e %.2e %.2e %.2e\n",
                  t.name.c_str(), e[0], e[1], e[2], e[3]);
    for (size_t c = 1; c < e.size(); ++c)
      EXPECT_LT(e[c], e[c - 1]) << t.name << ": the error rose at step " << 100 * (c + 1);
    EXPECT_LT(e.back(), 1e-2) << t.name;
  }
}

// Not run by CTest (--gtest_also_run_disabled_tests runs it): SparseLoCo's
// recipe across chunk densities, H, the error-feedback decay and the outer
// lr, each run to 4x gradient_allreduce's steps; rank 0 prints the steps
// (-1: missed) and the error at success or at the budget, the figures of
// docs/algorithms.md. RELAXCC_SWEEP_QUICK=1 runs the density x H grid only.
TEST(Diloco, DISABLED_SparseLocoSweep) {
  const Trial baseline =
      sgd_trial("gradient_allreduce + SGD", [] { return std::make_shared<GradientAllreduce>(); });
  const RunResult base = run(problem(), baseline, 40000);
  ASSERT_GT(base.steps, 0);
  const int64_t budget = 4 * base.steps;
  if (world_rank() == 0)
    std::printf("[sweep] %d ranks: baseline %lld steps, budget %lld\n", world_size(),
                static_cast<long long>(base.steps), static_cast<long long>(budget));
  const bool quick = Tunables::from_env().sweep_quick == 1;
  struct Setting {
    int kept, h;
    float beta, lr;
  };
  std::vector<Setting> settings;
  for (int kept : {2, 4, 8, 16, 32})
    for (int h : {2, 3, 5, 10}) settings.push_back({kept, h, 0.95f, 1.0f});
  if (!quick)
    for (int kept : {2, 4, 8, 16})
      for (int h : {2, 3, 5, 10})
        for (float beta : {0.8f, 0.9f, 1.0f})
          for (float lr : {0.7f, 1.0f, 1.5f}) settings.push_back({kept, h, beta, lr});
  for (const Setting& s : settings) {
    DilocoOptions o = sparseloco_options(s.h);
    o.chunk_topk->ratio = s.kept / 64.0;
    o.feedback_decay = s.beta;
    o.outer_lr = s.lr;
    const RunResult r = run(problem(), sgd_trial("sweep", make<Diloco>(o)), budget);
    if (world_rank() == 0)
      std::printf("[sweep] top-%2d/64 H %2d beta %.2f lr %.1f: %6lld steps (%.2fx): error %.2e\n",
                  s.kept, s.h, static_cast<double>(s.beta), static_cast<double>(s.lr),
                  static_cast<long long>(r.steps),
                  static_cast<double>(r.steps) / static_cast<double>(base.steps), r.error);
  }
}

// Saved at step 31: mid-round, an eager or overlapped exchange unapplied,
// error feedback in use.
TEST(Diloco, CheckpointResumesBitForBit) {
  std::vector<DilocoVariant> variants = diloco_variants();
  variants.push_back({"diloco (SparseLoCo: chunk top-2/64)", sparseloco_options(5)});
  for (const DilocoVariant& d : variants) {
    DilocoOptions h = d.options;
    h.inner_steps = 6;
    expect_resumes_bit_for_bit(sgd_trial(d.name + " at H 6", make<Diloco>(h)), 31, 50);
  }
}

// Diloco's constructor refuses the options `o` after change(o) with an
// InvalidArgument whose message mentions `mentions`.
template <typename Change>
void expect_diloco_invalid(DilocoOptions o, Change change, const std::string& mentions) {
  change(o);
  expect_invalid([&o] { Diloco d(o); }, mentions);
}

TEST(Diloco, BadConfigurationIsInvalidArgument) {
  expect_invalid([] { Diloco d(diloco_options(0)); }, "diloco: inner_steps (H) must be >= 1");
  expect_diloco_invalid(
      diloco_options(10), [](DilocoOptions& o) { o.fragments = 0; }, "fragments");
  // More fragments than inner steps to sync them in.
  expect_diloco_invalid(
      diloco_options(4), [](DilocoOptions& o) { o.fragments = 5; }, "fragments");
  // More fragments than the plan's 3 buckets: refused when bound.
  expect_invalid(
      [] {
        DilocoOptions o = diloco_options(10);
        o.fragments = 4;
        const Trial t = sgd_trial("diloco", make<Diloco>(o));
        Training training(problem(), t, t.algorithm());
      },
      "4 fragments of whole buckets need at least 4 buckets of parameters, the plan has 3");
  expect_diloco_invalid(
      sparseloco_options(10), [](DilocoOptions& o) { o.chunk_topk->chunk = 0; },
      "chunk_topk: ChunkTopkConfig.chunk must be in [1, 65536], got 0");
  for (double ratio : {0.0, 1.5}) {
    expect_diloco_invalid(
        sparseloco_options(10), [ratio](DilocoOptions& o) { o.chunk_topk->ratio = ratio; },
        "ratio (the fraction of each chunk kept) must be in (0, 1]");
  }
  expect_diloco_invalid(
      sparseloco_options(10), [](DilocoOptions& o) { o.codec = minmax_codec(2); },
      "set codec or chunk_topk, not both");
  expect_diloco_invalid(
      diloco_options(10), [](DilocoOptions& o) { o.overlap_steps = 11; }, "overlap_steps");
  expect_diloco_invalid(
      diloco_options(10), [](DilocoOptions& o) { o.outer_momentum = 1.0f; }, "outer_momentum");
  expect_diloco_invalid(
      sparseloco_options(10), [](DilocoOptions& o) { o.hierarchical = true; }, "hierarchical");
  expect_diloco_invalid(
      diloco_options(10), [](DilocoOptions& o) { o.codec = minmax_codec(3); }, "bits");
}

}  // namespace
}  // namespace relaxcc::test
