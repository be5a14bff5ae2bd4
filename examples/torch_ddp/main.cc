// The loop of before.cc, data parallel with relaxcc::torch: every rank draws
// its own batches, gradients are averaged by GradientAllreduce, and every
// rank takes the same step (rank 0's initial weights are broadcast). Three
// lines differ from before.cc: the include, the wrapper, and ddp.step().
#include <torch/torch.h>

#include <cstdio>
#include <random>

#include "relaxcc/torch/ddp.h"

int main() {
  torch::manual_seed(std::random_device{}());  // each process draws its own batches
  torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::ReLU(),
                              torch::nn::Linear(32, 2));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  relaxcc::torch::DistributedDataParallel ddp(*model, optimizer);  // gradient_allreduce

  float last = 0;
  for (int step = 0; step < 300; ++step) {
    torch::Tensor x = torch::randn({32, 8});
    torch::Tensor y = (x.sum(1) > 0).to(torch::kLong);  // the class: the sign of the sum
    optimizer.zero_grad();
    torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
    ddp.step();
    last = loss.item<float>();
  }
  std::printf("torch_ddp: final loss %.4f\n", last);
  return last < 0.3f ? 0 : 1;
}
