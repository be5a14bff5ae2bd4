// Every algorithm module on the convergence harness (convergence_harness.h):
// success within its step budget against gradient_allreduce measured in the
// same test, checkpoints that resume bit for bit, and bad configurations.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <gtest/gtest.h>

#include "convergence_harness.h"
#include "relaxcc/algorithms/bytegrad.h"
#include "relaxcc/algorithms/cocktail_sgd.h"
#include "relaxcc/algorithms/gradient_allreduce.h"
#include "relaxcc/algorithms/local_sgd.h"
#include "relaxcc/algorithms/qadam.h"
#include "relaxcc/errors.h"

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
  t.set_lr = [](Algorithm& a, float lr) { dynamic_cast<QAdam&>(a).set_lr(lr); };
  return t;
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
      sgd_trial("local_sgd",
                [] {
                  return std::make_shared<LocalSgd>(LocalSgdOptions{4, 3});
                }),
      qadam_trial("qadam min-max", qadam_minmax),
      qadam_trial("qadam sign", qadam_sign),
  };
  for (const Trial& t : trials) {
    const auto [straight, resumed] = checkpoint_roundtrip(problem(), t, 30, 50);
    ASSERT_EQ(straight.size(), resumed.size());
    EXPECT_EQ(std::memcmp(straight.data(), resumed.data(), straight.size() * sizeof(float)), 0)
        << t.name << " left the trajectory after a checkpoint";
    // And the runs moved: the comparison is not between two zero models.
    double norm = 0;
    for (float v : straight) norm += static_cast<double>(v) * v;
    EXPECT_GT(norm, 1.0) << t.name;
  }
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

}  // namespace
}  // namespace relaxcc::test
