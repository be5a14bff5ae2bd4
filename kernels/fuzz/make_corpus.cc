// Writes the seed corpus of the decoder fuzzers: valid payloads of each kind
// at a few sizes and settings, one file each, into <dir>/<kind>/.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "relaxcc/kernels/chunk_topk.h"
#include "relaxcc/kernels/compressor.h"
#include "relaxcc/kernels/payload_packing.h"

using namespace relaxcc;
using namespace relaxcc::kernels;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus DIR\n");
    return 2;
  }
  const std::filesystem::path root = argv[1];
  int written = 0;
  for (int kind = 1; kind <= 7; ++kind) {
    const auto k = static_cast<CompressorKind>(kind);
    const auto dir = root / compressor_name(k);
    std::filesystem::create_directories(dir);
    int seed = 0;
    for (int64_t n : {0, 1, 5, 64, 300}) {
      for (int bits : {8, 4, 1}) {
        for (auto mode : {RandomKMode::stratified, RandomKMode::rolling}) {
          CompressorConfig c;
          c.kind = k;
          c.bits = bits;
          c.chunk = 32;
          c.ratio = 0.25;
          // cocktail: indices that travel, then (each other mode pair)
          // implicit ones.
          c.topk_ratio = seed / 2 % 2 == 1 ? 1.0 : 0.2;
          c.random_mode = mode;
          c.step = static_cast<uint64_t>(seed);
          std::vector<float> x(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i)
            x[i] = std::sin(0.7f * static_cast<float>(i + seed)) * (1 + i % 5);
          std::vector<std::byte> out(encoded_size(n, c));
          encode(TensorView::host(x.data(), n), out, c, ExecContext::host());
          std::ofstream f(dir / ("seed_" + std::to_string(seed++)), std::ios::binary);
          f.write(reinterpret_cast<const char*>(out.data()),
                  static_cast<std::streamsize>(out.size()));
          ++written;
        }
      }
    }
  }
  // minmax and cocktail chunks whose ranges are below 2^-100: pre-scaled
  // (a negative scale field).
  for (auto k : {CompressorKind::minmax, CompressorKind::cocktail}) {
    for (int bits : {8, 4, 2, 1}) {
      CompressorConfig c;
      c.kind = k;
      c.bits = bits;
      c.chunk = 16;
      c.ratio = 0.5;
      c.topk_ratio = 1.0;
      const int64_t n = 64;
      std::vector<float> x(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        x[i] = std::sin(0.7f * static_cast<float>(i)) * 1e-39f * static_cast<float>(1 + i % 5);
      std::vector<std::byte> out(encoded_size(n, c));
      encode(TensorView::host(x.data(), n), out, c, ExecContext::host());
      std::ofstream f(root / compressor_name(k) / ("tiny_" + std::to_string(bits)),
                      std::ios::binary);
      f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
      ++written;
    }
  }
  // chunk_topk (chunk_topk.h): its own payload format.
  const auto dir = root / "chunk_topk";
  std::filesystem::create_directories(dir);
  int seed = 0;
  for (int64_t n : {0, 1, 5, 64, 300}) {
    for (int bits : {8, 2, 1}) {
      for (int64_t chunk : {16, 300}) {
        ChunkTopkConfig c;
        c.chunk = chunk;
        c.ratio = 0.1;
        c.bits = bits;
        c.group = 8;
        std::vector<float> x(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i)
          x[i] = std::sin(0.7f * static_cast<float>(i + seed)) * (1 + i % 5);
        std::vector<std::byte> out(chunk_topk_encoded_size(n, c));
        chunk_topk_encode(TensorView::host(x.data(), n), out, c, ExecContext::host());
        std::ofstream f(dir / ("seed_" + std::to_string(seed++)), std::ios::binary);
        f.write(reinterpret_cast<const char*>(out.data()),
                static_cast<std::streamsize>(out.size()));
        ++written;
      }
    }
  }
  // packed: 2-bit min-max payloads of a few sizes, packed.
  const auto packed_dir = root / "packed";
  std::filesystem::create_directories(packed_dir);
  for (int64_t n : {0, 1, 64, 3000}) {
    CompressorConfig c;
    c.kind = CompressorKind::minmax;
    c.bits = 2;
    c.chunk = 2048;
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[i] = std::sin(0.7f * static_cast<float>(i)) * (1 + i % 5);
    std::vector<std::byte> raw(encoded_size(n, c));
    encode(TensorView::host(x.data(), n), raw, c, ExecContext::host());
    std::vector<std::byte> out(packed_bound(raw.size()));
    out.resize(pack_payload(raw, out));
    std::ofstream f(packed_dir / ("seed_" + std::to_string(n)), std::ios::binary);
    f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
    ++written;
  }
  std::printf("wrote %d seeds under %s\n", written, root.c_str());
  return 0;
}
