#include "model_layers.h"

#include "relaxcc/errors.h"

namespace relaxcc::bench {

std::vector<Layer> resnet50_layers() {
  std::vector<Layer> l;
  auto conv = [&](const std::string& n, int64_t in, int64_t out, int64_t k) {
    l.push_back({n + ".weight", in * out * k * k});
  };
  auto bn = [&](const std::string& n, int64_t c) {
    l.push_back({n + ".weight", c});
    l.push_back({n + ".bias", c});
  };
  conv("conv1", 3, 64, 7);
  bn("bn1", 64);
  const int blocks[4] = {3, 4, 6, 3};
  int64_t in = 64;
  for (int s = 0; s < 4; ++s) {
    const int64_t w = 64 << s;
    for (int b = 0; b < blocks[s]; ++b) {
      const std::string p = "layer" + std::to_string(s + 1) + "." + std::to_string(b);
      conv(p + ".conv1", in, w, 1);
      bn(p + ".bn1", w);
      conv(p + ".conv2", w, w, 3);
      bn(p + ".bn2", w);
      conv(p + ".conv3", w, 4 * w, 1);
      bn(p + ".bn3", 4 * w);
      if (b == 0) {
        conv(p + ".downsample.0", in, 4 * w, 1);
        bn(p + ".downsample.1", 4 * w);
      }
      in = 4 * w;
    }
  }
  l.push_back({"fc.weight", 2048 * 1000});
  l.push_back({"fc.bias", 1000});
  return l;
}

std::vector<Layer> bert_base_layers() {
  const int64_t h = 768, ff = 3072;
  std::vector<Layer> l{{"embeddings.word_embeddings.weight", 30522 * h},
                       {"embeddings.position_embeddings.weight", 512 * h},
                       {"embeddings.token_type_embeddings.weight", 2 * h},
                       {"embeddings.LayerNorm.weight", h},
                       {"embeddings.LayerNorm.bias", h}};
  for (int i = 0; i < 12; ++i) {
    const std::string p = "encoder.layer." + std::to_string(i);
    for (const char* m : {".attention.self.query", ".attention.self.key", ".attention.self.value",
                          ".attention.output.dense"}) {
      l.push_back({p + m + ".weight", h * h});
      l.push_back({p + m + ".bias", h});
    }
    l.push_back({p + ".attention.output.LayerNorm.weight", h});
    l.push_back({p + ".attention.output.LayerNorm.bias", h});
    l.push_back({p + ".intermediate.dense.weight", h * ff});
    l.push_back({p + ".intermediate.dense.bias", ff});
    l.push_back({p + ".output.dense.weight", ff * h});
    l.push_back({p + ".output.dense.bias", h});
    l.push_back({p + ".output.LayerNorm.weight", h});
    l.push_back({p + ".output.LayerNorm.bias", h});
  }
  l.push_back({"pooler.dense.weight", h * h});
  l.push_back({"pooler.dense.bias", h});
  return l;
}

std::vector<Layer> model_layers(const std::string& model) {
  if (model == "resnet50") return resnet50_layers();
  if (model == "bert-base") return bert_base_layers();
  RELAXCC_THROW(InvalidArgument, "unknown model '", model, "': expected resnet50 or bert-base");
}

}  // namespace relaxcc::bench
