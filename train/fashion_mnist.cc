#include "fashion_mnist.h"

#include <zlib.h>

#include <filesystem>

#include "relaxcc/errors.h"

namespace relaxcc::train {

namespace {

// The whole file, decompressed when it is gzip (zlib reads plain files as
// they are).
std::vector<uint8_t> read_file(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  RELAXCC_ENFORCE(f != nullptr, InvalidArgument, "Fashion-MNIST: cannot open '", path, "'");
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
  int err = 0;
  const std::string message = n < 0 ? gzerror(f, &err) : "";
  gzclose(f);
  if (n < 0) RELAXCC_THROW(CorruptPayload, "Fashion-MNIST: '", path, "': ", message);
  return out;
}

std::string find(const std::string& dir, const std::string& name) {
  const std::filesystem::path plain = std::filesystem::path(dir) / name;
  if (std::filesystem::exists(plain)) return plain.string();
  const std::string gz = plain.string() + ".gz";
  RELAXCC_ENFORCE(std::filesystem::exists(gz), InvalidArgument, "Fashion-MNIST: neither '",
                  plain.string(), "' nor '", gz,
                  "' exists (Debian: apt-get install dataset-fashion-mnist)");
  return gz;
}

// Fashion-MNIST's images are 28 x 28 (the models' input).
constexpr int64_t kSide = 28;

uint32_t big_endian(const std::vector<uint8_t>& b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) | (uint32_t{b[at + 2]} << 8) |
         uint32_t{b[at + 3]};
}

// The dimensions of an IDX file of unsigned bytes with `dims` dimensions,
// checked against the file's length.
std::vector<int64_t> header(const std::vector<uint8_t>& b, uint32_t dims, const std::string& path) {
  const size_t head = 4 + 4 * size_t{dims};
  RELAXCC_ENFORCE(b.size() >= head, CorruptPayload, "Fashion-MNIST: '", path, "' has ", b.size(),
                  " bytes, shorter than its ", head, "-byte IDX header");
  const uint32_t magic = big_endian(b, 0);
  RELAXCC_ENFORCE_EQ(magic, 0x800u | dims, CorruptPayload, "Fashion-MNIST: '", path,
                     "': IDX magic (expected, got)");
  std::vector<int64_t> sizes;
  int64_t total = 1;
  std::string shape;
  for (uint32_t d = 0; d < dims; ++d) {
    sizes.push_back(big_endian(b, 4 + 4 * d));
    shape += detail::concat(d ? " x " : "", sizes.back());
  }
  for (const int64_t size : sizes)
    RELAXCC_ENFORCE(!__builtin_mul_overflow(total, size, &total), CorruptPayload,
                    "Fashion-MNIST: '", path, "': dimensions ", shape,
                    " hold more bytes than an int64 counts; expected ", b.size() - head,
                    " bytes after the header");
  RELAXCC_ENFORCE_EQ(static_cast<int64_t>(b.size() - head), total, CorruptPayload,
                     "Fashion-MNIST: '", path, "': bytes after the header (file, dimensions ",
                     shape, ")");
  return sizes;
}

Split load_split(const std::string& dir, const std::string& prefix) {
  Split s;
  const std::string image_path = find(dir, prefix + "-images-idx3-ubyte");
  const std::string label_path = find(dir, prefix + "-labels-idx1-ubyte");
  std::vector<uint8_t> images = read_file(image_path);
  std::vector<uint8_t> labels = read_file(label_path);
  const std::vector<int64_t> dims = header(images, 3, image_path);
  RELAXCC_ENFORCE(dims[1] == kSide && dims[2] == kSide, CorruptPayload, "Fashion-MNIST: '",
                  image_path, "': images are ", dims[1], "x", dims[2], ", expected ", kSide, "x",
                  kSide);
  const std::vector<int64_t> count = header(labels, 1, label_path);
  RELAXCC_ENFORCE_EQ(dims[0], count[0], CorruptPayload, "Fashion-MNIST: images in '", image_path,
                     "' and labels in '", label_path, "'");
  s.count = dims[0];
  s.rows = dims[1];
  s.cols = dims[2];
  s.pixels.assign(images.begin() + 16, images.end());
  s.labels.assign(labels.begin() + 8, labels.end());
  for (size_t i = 0; i < s.labels.size(); ++i)
    RELAXCC_ENFORCE(s.labels[i] <= 9, CorruptPayload, "Fashion-MNIST: '", label_path, "': label ",
                    int{s.labels[i]}, " at ", i, " is not a class 0..9");
  return s;
}

}  // namespace

FashionMnist load_fashion_mnist(const std::string& dir) {
  return FashionMnist{load_split(dir, "train"), load_split(dir, "t10k")};
}

}  // namespace relaxcc::train
