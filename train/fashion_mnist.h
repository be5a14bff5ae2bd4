// Fashion-MNIST from its IDX files (Debian's dataset-fashion-mnist installs
// them gzip-compressed under /usr/share/datasets/fashion-mnist), parsed here:
// IDX is a big-endian header (magic 0x00000803 for images, 0x00000801 for
// labels, then one 32-bit size per dimension) followed by the bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace relaxcc::train {

struct Split {
  int64_t count = 0;
  int64_t rows = 0, cols = 0;   // 28 x 28
  std::vector<uint8_t> pixels;  // count x rows x cols
  std::vector<uint8_t> labels;  // count, each 0..9
};

struct FashionMnist {
  Split train, test;
};

// Reads <dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte, each plain or
// with .gz. Throws InvalidArgument naming the file when one is missing and
// CorruptPayload when one is malformed (bad magic, dimensions whose product
// overflows int64 or disagrees with the file's length, images other than
// 28 x 28, counts that disagree with the other file, a label above 9).
FashionMnist load_fashion_mnist(const std::string& dir);

}  // namespace relaxcc::train
