// Parameter tensor sizes of real models, in registration (forward) order,
// for synthetic backward passes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace relaxcc::bench {

struct Layer {
  std::string name;
  int64_t numel;
};

// torchvision's ResNet-50: 161 tensors, 25,557,032 parameters.
std::vector<Layer> resnet50_layers();
// BERT-base (uncased, with pooler): 199 tensors, 109,482,240 parameters.
std::vector<Layer> bert_base_layers();
// "resnet50" or "bert-base"; throws InvalidArgument otherwise.
std::vector<Layer> model_layers(const std::string& model);

}  // namespace relaxcc::bench
