// Data-parallel linear regression with the Reducer: every rank fits
// y = w.x + b to its own shard of synthetic data, and GradientAllreduce
// averages the gradients, so every rank takes the same SGD step.
//
// Run under mpiexec at any number of ranks. Exits 1 unless the global loss
// fell below 1% of its start and every rank ends with the same model, bit
// for bit.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "relaxcc/algorithms/gradient_allreduce.h"
#include "relaxcc/create_communicator.h"
#include "relaxcc/errors.h"
#include "relaxcc/optimizer.h"
#include "relaxcc/reducer.h"

namespace {

constexpr int kFeatures = 16;
constexpr int kSamples = 256;  // per rank
constexpr int kSteps = 200;

// This rank's shard: features from N(0, 1), targets from the same true model
// on every rank, plus a little noise.
struct Shard {
  std::vector<float> x;  // kSamples x kFeatures, row-major
  std::vector<float> y;
  explicit Shard(int rank) : x(kSamples * kFeatures), y(kSamples) {
    std::mt19937 rng(1234 + rank);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : x) v = normal(rng);
    for (int i = 0; i < kSamples; ++i) {
      float t = 0.5f;  // true bias
      for (int j = 0; j < kFeatures; ++j) t += static_cast<float>(j % 5 - 2) * x[i * kFeatures + j];
      y[i] = t + 0.01f * normal(rng);
    }
  }
};

// Mean squared error of (w, b) on the shard; with grad_w and grad_b given,
// also its gradient.
float mse(const Shard& s, const std::vector<float>& w, float b,
          std::vector<float>* grad_w = nullptr, float* grad_b = nullptr) {
  if (grad_w != nullptr) {
    std::fill(grad_w->begin(), grad_w->end(), 0.0f);
    *grad_b = 0.0f;
  }
  double loss = 0.0;
  for (int i = 0; i < kSamples; ++i) {
    float pred = b;
    for (int j = 0; j < kFeatures; ++j) pred += w[j] * s.x[i * kFeatures + j];
    const float err = pred - s.y[i];
    loss += static_cast<double>(err) * err;
    if (grad_w != nullptr) {
      const float g = 2.0f * err / kSamples;
      for (int j = 0; j < kFeatures; ++j) (*grad_w)[j] += g * s.x[i * kFeatures + j];
      *grad_b += g;
    }
  }
  return static_cast<float>(loss / kSamples);
}

// The loss averaged over every rank's shard.
float global_loss(relaxcc::Communicator& comm, const Shard& s, const std::vector<float>& w,
                  float b) {
  float loss = mse(s, w, b);
  comm.allreduce(relaxcc::TensorView::host(&loss, 1), relaxcc::ExecContext::host())->wait();
  return loss / static_cast<float>(comm.size());
}

// `transport`: mpi (under mpirun) or ucx (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT
// or RELAXCC_RENDEZVOUS, with or without mpirun).
int run(const std::string& transport) {
  using namespace relaxcc;
  // On MPI, MPI is initialized here (MPI_THREAD_MULTIPLE) and finalized at exit.
  CommunicatorPtr comm = create_communicator(transport);
  const int rank = comm->rank();
  const Shard shard(rank);

  // The model and its gradients. Every rank starts from the same weights.
  std::vector<float> w(kFeatures, 0.0f), grad_w(kFeatures);
  float b = 0.0f, grad_b = 0.0f;

  // Registration order: gradients with the index of their parameter
  // (TensorSpec::partner). The Reducer buckets the gradients; Sgd updates
  // each gradient's partner in optimizer_step.
  std::vector<TensorSpec> tensors{
      {"w.grad", TensorView::host(grad_w.data(), kFeatures), TensorRole::gradient, 1},
      {"w", TensorView::host(w.data(), kFeatures), TensorRole::parameter},
      {"b.grad", TensorView::host(&grad_b, 1), TensorRole::gradient, 3},
      {"b", TensorView::host(&b, 1), TensorRole::parameter},
  };
  auto algorithm = std::make_shared<algorithms::GradientAllreduce>();  // averages
  Reducer reducer(comm, tensors, algorithm, ExecContext::host());
  Sgd sgd(SgdOptions{.lr = 0.05f, .momentum = 0.9f});

  const float first = global_loss(*comm, shard, w, b);
  for (int step = 0; step < kSteps; ++step) {
    reducer.begin_step();
    mse(shard, w, b, &grad_w, &grad_b);  // "forward and backward"
    // Backward produces gradients last layer first: hand each over as soon
    // as it is ready, so its bucket's allreduce overlaps the rest.
    reducer.mark_ready("b.grad");
    reducer.mark_ready("w.grad");
    reducer.synchronize();        // every gradient now holds the average
    reducer.optimizer_step(sgd);  // w -= lr * ..., on every rank alike
  }
  const float last = global_loss(*comm, shard, w, b);

  // Every rank must hold rank 0's model, bit for bit.
  std::vector<float> mine(w);
  mine.push_back(b);
  std::vector<float> all(mine.size() * comm->size());
  comm->allgather(TensorView::host(mine.data(), static_cast<int64_t>(mine.size())),
                  TensorView::host(all.data(), static_cast<int64_t>(all.size())),
                  ExecContext::host())
      ->wait();
  bool same = true;
  for (int r = 0; r < comm->size(); ++r)
    same = same &&
           std::memcmp(all.data() + r * mine.size(), all.data(), mine.size() * sizeof(float)) == 0;

  const bool fell = std::isfinite(last) && last < 0.01f * first;
  if (rank == 0) {
    std::printf("reducer: %d ranks, %d steps, %zu bucket(s): loss %.6f -> %.6f (%s), models %s\n",
                comm->size(), kSteps, reducer.plan().buckets().size(), first, last,
                fell ? "fell" : "DID NOT FALL", same ? "identical" : "DIFFER");
    std::printf(
        "reducer: w[0..4] = %.3f %.3f %.3f %.3f %.3f (true -2 -1 0 1 2), b = %.3f (true 0.5)\n",
        w[0], w[1], w[2], w[3], w[4], b);
  }
  return fell && same ? 0 : 1;
}

}  // namespace

// usage: reducer [--transport mpi|ucx]
int main(int argc, char** argv) {
  const std::string transport =
      argc == 3 && std::string(argv[1]) == "--transport" ? argv[2] : "mpi";
  try {
    return run(transport);
  } catch (const relaxcc::Error& e) {
    std::fprintf(stderr, "reducer: %s\n", e.what());
    return 1;
  }
}
