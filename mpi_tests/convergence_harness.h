// The convergence harness every algorithm module is held to.
//
// The problem is fixed, so it cannot be tuned away:
//   - distributed least squares, kFeatures = 256 features: rank r holds
//     kRows = 1024 rows (A_r, b_r) of its own IID shard and minimizes
//     f(x) = 1 / (2 M) sum_r ||A_r x - b_r||^2 over all M = ranks * kRows
//     rows; its gradient is the average over ranks of
//     g_r(x) = A_r^T (A_r x - b_r) / kRows;
//   - rows are N(0, diag(s^2)) with s_j^2 geometric from 1 to
//     1 / kPopulationCondition, b = A x_true + 0.1 noise, all from
//     deterministic seeds (x_true from one seed on every rank, the rows of
//     rank r from seed + r, by SplitMix64 and Box-Muller: the same numbers on
//     every platform), so the condition number of the Hessian A^T A / M is
//     about 100 (measured: condition());
//   - x* is solved in double from the allreduced normal equations;
//   - the learning rate decays as lr0 / (1 + t / kDecaySteps).
// Success: the averaged model x = mean_r x_r has ||x - x*|| / ||x*|| <=
// kTolerance and every rank's ||x_r - x|| / ||x*|| <= kTolerance, checked
// every kCheckEvery steps (a multiple of local_sgd's default period).
//
// run() trains one Trial through a Reducer (the model registered as
// kTensors gradient/parameter pairs, in buckets small enough that there are
// several) and returns the first checked step at which success holds. A
// later algorithm adds a Trial; its budget is a multiple of the steps of
// gradient_allreduce measured with the same optimizer in the same test.
// checkpoint_roundtrip() runs a Trial to `steps` twice, once straight and
// once stopped at `save_at`, serialized (algorithm, optimizer, parameters),
// torn down and resumed in a new Reducer and Algorithm, and returns both
// final models for a bitwise comparison.
#pragma once

#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "relaxcc/algorithm.h"
#include "relaxcc/algorithms/step_offset.h"
#include "relaxcc/optimizer.h"
#include "relaxcc/reducer.h"
#include "test_util.h"

namespace relaxcc::test {

inline constexpr int kFeatures = 256;
inline constexpr int kRows = 1024;
inline constexpr int kTensors = 4;  // the model as 4 tensors of 64
inline constexpr double kPopulationCondition = 66.0;
inline constexpr double kTolerance = 1e-3;
inline constexpr int kCheckEvery = 20;
inline constexpr double kDecaySteps = 1000.0;

// SplitMix64 and Box-Muller: portable, deterministic normals.
class Normal {
 public:
  explicit Normal(uint64_t seed) : state_(seed) {}
  double operator()() {
    const double u1 = (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = static_cast<double>(next() >> 11) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

class LeastSquares {
 public:
  // Collective over MPI_COMM_WORLD.
  LeastSquares() : rank_(world_rank()), size_(world_size()) {
    const int n = kFeatures;
    std::vector<double> scale(n), x_true(n);
    Normal shared(42);
    for (int j = 0; j < n; ++j) {
      scale[j] = std::pow(kPopulationCondition, -0.5 * j / (n - 1));
      x_true[j] = shared();
    }
    Normal own(1000 + static_cast<uint64_t>(rank_));
    a_.resize(static_cast<size_t>(kRows) * n);
    b_.resize(kRows);
    for (int i = 0; i < kRows; ++i) {
      double dot = 0;
      for (int j = 0; j < n; ++j) {
        const double v = own() * scale[j];
        a_[static_cast<size_t>(i) * n + j] = static_cast<float>(v);
        dot += static_cast<double>(a_[static_cast<size_t>(i) * n + j]) * x_true[j];
      }
      b_[i] = static_cast<float>(dot + 0.1 * own());
    }
    // H = A^T A / M and c = A^T b / M over every rank's rows.
    std::vector<double> h(static_cast<size_t>(n) * n, 0.0), c(n, 0.0);
    for (int i = 0; i < kRows; ++i) {
      const float* row = &a_[static_cast<size_t>(i) * n];
      for (int j = 0; j < n; ++j) {
        c[j] += static_cast<double>(row[j]) * b_[i];
        for (int k = 0; k < n; ++k) h[static_cast<size_t>(j) * n + k] += double(row[j]) * row[k];
      }
    }
    MPI_Allreduce(MPI_IN_PLACE, h.data(), n * n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, c.data(), n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    const double m = static_cast<double>(kRows) * size_;
    for (double& v : h) v /= m;
    for (double& v : c) v /= m;
    // Cholesky H = L L^T, then x* = H^-1 c; lambda_min by inverse iteration,
    // lambda_max by power iteration.
    std::vector<double> l = h;
    for (int j = 0; j < n; ++j) {
      for (int k = 0; k < j; ++k) l[static_cast<size_t>(j) * n + k] = 0.0;
    }
    for (int j = 0; j < n; ++j) {
      double d = h[static_cast<size_t>(j) * n + j];
      for (int k = 0; k < j; ++k)
        d -= l[static_cast<size_t>(j) * n + k] * l[static_cast<size_t>(j) * n + k];
      const double djj = std::sqrt(d);
      l[static_cast<size_t>(j) * n + j] = djj;
      for (int i = j + 1; i < n; ++i) {
        double s = h[static_cast<size_t>(i) * n + j];
        for (int k = 0; k < j; ++k)
          s -= l[static_cast<size_t>(i) * n + k] * l[static_cast<size_t>(j) * n + k];
        l[static_cast<size_t>(i) * n + j] = s / djj;
      }
    }
    const auto solve = [&](std::vector<double> v) {
      for (int i = 0; i < n; ++i) {
        for (int k = 0; k < i; ++k) v[i] -= l[static_cast<size_t>(i) * n + k] * v[k];
        v[i] /= l[static_cast<size_t>(i) * n + i];
      }
      for (int i = n - 1; i >= 0; --i) {
        for (int k = i + 1; k < n; ++k) v[i] -= l[static_cast<size_t>(k) * n + i] * v[k];
        v[i] /= l[static_cast<size_t>(i) * n + i];
      }
      return v;
    };
    xstar_ = solve(c);
    const auto normalized = [](std::vector<double> v) {
      double s = 0;
      for (double e : v) s += e * e;
      s = std::sqrt(s);
      for (double& e : v) e /= s;
      return std::pair{v, s};
    };
    std::vector<double> v(n, 1.0);
    double lmin = 0, lmax = 0;
    for (int it = 0; it < 300; ++it) {
      auto [u, s] = normalized(solve(v));
      v = u;
      lmin = 1.0 / s;
    }
    std::fill(v.begin(), v.end(), 1.0);
    for (int it = 0; it < 300; ++it) {
      std::vector<double> w(n, 0.0);
      for (int j = 0; j < n; ++j)
        for (int k = 0; k < n; ++k) w[j] += h[static_cast<size_t>(j) * n + k] * v[k];
      auto [u, s] = normalized(w);
      v = u;
      lmax = s;
    }
    lipschitz_ = lmax;
    condition_ = lmax / lmin;
    for (double e : xstar_) xstar_norm_ += e * e;
    xstar_norm_ = std::sqrt(xstar_norm_);
  }

  // g = A_r^T (A_r x - b_r) / kRows, this rank's gradient at x.
  void gradient(const float* x, float* g) const {
    std::vector<float> residual(kRows);
    for (int i = 0; i < kRows; ++i) {
      const float* row = &a_[static_cast<size_t>(i) * kFeatures];
      float s = -b_[i];
      for (int j = 0; j < kFeatures; ++j) s += row[j] * x[j];
      residual[i] = s;
    }
    std::fill(g, g + kFeatures, 0.0f);
    for (int i = 0; i < kRows; ++i) {
      const float* row = &a_[static_cast<size_t>(i) * kFeatures];
      const float r = residual[i] / kRows;
      for (int j = 0; j < kFeatures; ++j) g[j] += r * row[j];
    }
  }

  // Collective: ||mean_r x_r - x*|| / ||x*|| and the largest
  // ||x_r - mean|| / ||x*|| over the ranks.
  std::pair<double, double> errors(const float* x) const {
    std::vector<double> mean(x, x + kFeatures);
    MPI_Allreduce(MPI_IN_PLACE, mean.data(), kFeatures, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double err = 0, dev = 0;
    for (int j = 0; j < kFeatures; ++j) {
      mean[j] /= size_;
      err += (mean[j] - xstar_[j]) * (mean[j] - xstar_[j]);
      dev += (x[j] - mean[j]) * (x[j] - mean[j]);
    }
    MPI_Allreduce(MPI_IN_PLACE, &dev, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return {std::sqrt(err) / xstar_norm_, std::sqrt(dev) / xstar_norm_};
  }

  double condition() const { return condition_; }
  // The largest eigenvalue of the Hessian: 1 / lipschitz() is a stable step.
  double lipschitz() const { return lipschitz_; }

 private:
  int rank_, size_;
  std::vector<float> a_, b_;
  std::vector<double> xstar_;
  double xstar_norm_ = 0, condition_ = 0, lipschitz_ = 0;
};

// A frontend optimizer whose learning rate follows a schedule: one made for
// each step's rate, carrying its state (momenta, step count) over.
class ScheduledOptimizer {
 public:
  using Factory = std::function<std::unique_ptr<Optimizer>(float lr)>;
  explicit ScheduledOptimizer(Factory make) : make_(std::move(make)) {}
  Optimizer& at(float lr) {
    current_ = make_(lr);
    current_->load_state_dict(state_);
    return *current_;
  }
  // After the step: keep the state for the next one.
  void keep() { state_ = current_->state_dict(); }
  StateDict& state() { return state_; }

 private:
  Factory make_;
  std::unique_ptr<Optimizer> current_;
  StateDict state_ = [] {
    StateDict sd;
    sd.put_int("steps", 0);
    return sd;
  }();
};

struct Trial {
  std::string name;
  std::function<AlgorithmPtr()> algorithm;
  ScheduledOptimizer::Factory optimizer;  // the frontend's (ignored when the algorithm owns it)
  float lr0 = 0;                          // the schedule's first rate
  // For an algorithm that owns the optimizer step: gives it each step's rate.
  std::function<void(Algorithm&, float)> set_lr;
  // The algorithm leaves the ranks' models apart between its syncs by
  // design and offers an exact average before evaluation (streaming
  // DiLoCo, say): success then asks the averaged model's error only (the
  // consensus is still reported).
  bool averaged_for_evaluation = false;
};

inline float scheduled_lr(const Trial& trial, int64_t step) {
  return static_cast<float>(trial.lr0 / (1.0 + static_cast<double>(step) / kDecaySteps));
}

// A model being trained: parameters x (kFeatures) and their gradient, as
// kTensors registered pairs, driven by a Reducer.
class Training {
 public:
  // `module` runs from step `first_step` (wrapped in StepOffset after 0).
  Training(const LeastSquares& problem, const Trial& trial, AlgorithmPtr module,
           int64_t first_step = 0)
      : problem_(problem),
        trial_(trial),
        step_(first_step),
        optimizer_(trial.optimizer),
        module_(std::move(module)) {
    x_.assign(kFeatures, 0.0f);
    g_.assign(kFeatures, 0.0f);
    const int per = kFeatures / kTensors;
    std::vector<TensorSpec> specs;
    for (int t = 0; t < kTensors; ++t) {
      specs.push_back({"g" + std::to_string(t), TensorView::host(g_.data() + t * per, per),
                       TensorRole::gradient, 2 * t + 1});
      specs.push_back({"x" + std::to_string(t), TensorView::host(x_.data() + t * per, per),
                       TensorRole::parameter});
    }
    ReducerOptions o;  // several buckets: 64 elements first, then 128
    o.plan.first_cap_bytes = 64 * 4;
    o.plan.cap_bytes = 128 * 4;
    AlgorithmPtr driven =
        first_step > 0 ? std::make_shared<algorithms::StepOffset>(module_, first_step) : module_;
    reducer_ = std::make_unique<Reducer>(world(), specs, std::move(driven), ExecContext::host(), o);
  }

  void step() {
    reducer_->begin_step();
    problem_.gradient(x_.data(), g_.data());
    for (int t = kTensors - 1; t >= 0; --t) reducer_->mark_ready(2 * t);
    reducer_->synchronize();
    const float lr = scheduled_lr(trial_, step_);
    if (trial_.set_lr) trial_.set_lr(*module_, lr);
    reducer_->optimizer_step(optimizer_.at(lr));
    optimizer_.keep();
    ++step_;
  }

  int64_t steps() const { return step_; }
  std::vector<float>& x() { return x_; }
  Reducer& reducer() { return *reducer_; }
  Algorithm& module() { return *module_; }
  ScheduledOptimizer& optimizer() { return optimizer_; }

 private:
  const LeastSquares& problem_;
  const Trial& trial_;
  int64_t step_;
  ScheduledOptimizer optimizer_;
  AlgorithmPtr module_;
  std::vector<float> x_, g_;
  std::unique_ptr<Reducer> reducer_;
};

struct RunResult {
  int64_t steps = -1;               // first checked step that met the success criterion; -1: none
  double error = 0, consensus = 0;  // at that step, or at the budget
};

// Steps `t` until success (checked every kCheckEvery steps) or until it
// has taken `budget` steps; `before_step`, if set, runs before each step.
inline RunResult train_until(const LeastSquares& problem, const Trial& trial, Training& t,
                             int64_t budget, const std::function<void()>& before_step = {}) {
  RunResult r;
  while (t.steps() < budget) {
    if (before_step) before_step();
    t.step();
    if (t.steps() % kCheckEvery != 0) continue;
    std::tie(r.error, r.consensus) = problem.errors(t.x().data());
    if (r.error <= kTolerance && (trial.averaged_for_evaluation || r.consensus <= kTolerance)) {
      r.steps = t.steps();
      break;
    }
  }
  return r;
}

// Trains `trial` from x = 0 for at most `budget` steps.
inline RunResult run(const LeastSquares& problem, const Trial& trial, int64_t budget) {
  Training t(problem, trial, trial.algorithm());
  const RunResult r = train_until(problem, trial, t, budget);
  t.reducer().algorithm().shutdown(std::chrono::seconds(60));
  return r;
}

// A run of `trial` to `save_at` steps, checkpointed (drain, state_dict
// serialized with the optimizer and the parameters), torn down, and resumed
// in a new Reducer and Algorithm, ready for its step `save_at`.
inline std::unique_ptr<Training> checkpointed(const LeastSquares& problem, const Trial& trial,
                                              int64_t save_at) {
  std::vector<std::byte> algorithm_bytes, optimizer_bytes;
  std::vector<float> x;
  {
    Training t(problem, trial, trial.algorithm());
    while (t.steps() < save_at) t.step();
    Algorithm& a = t.reducer().algorithm();
    a.drain(std::chrono::seconds(60));
    algorithm_bytes = a.state_dict().serialize();
    optimizer_bytes = t.optimizer().state().serialize();
    x = t.x();
    a.shutdown(std::chrono::seconds(60));
  }
  auto t = std::make_unique<Training>(problem, trial, trial.algorithm(), save_at);
  t->module().load_state_dict(StateDict::deserialize(algorithm_bytes));
  t->optimizer().state() = StateDict::deserialize(optimizer_bytes);
  std::copy(x.begin(), x.end(), t->x().begin());
  return t;
}

// Final models of a straight run to `steps` and of one checkpointed at
// `save_at` and resumed in a new Reducer and Algorithm.
inline std::pair<std::vector<float>, std::vector<float>> checkpoint_roundtrip(
    const LeastSquares& problem, const Trial& trial, int64_t save_at, int64_t steps) {
  std::vector<float> straight;
  {
    Training t(problem, trial, trial.algorithm());
    while (t.steps() < steps) t.step();
    t.reducer().algorithm().shutdown(std::chrono::seconds(60));
    straight = t.x();
  }
  const std::unique_ptr<Training> t = checkpointed(problem, trial, save_at);
  while (t->steps() < steps) t->step();
  t->reducer().algorithm().shutdown(std::chrono::seconds(60));
  return {straight, t->x()};
}

}  // namespace relaxcc::test
