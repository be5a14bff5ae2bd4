#include "relaxcc/state_dict.h"

#include <cstring>

#include "relaxcc/errors.h"

namespace relaxcc {

void StateDict::put_floats(const std::string& key, const std::vector<float>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(float));
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  entries[key] = std::move(bytes);
}

std::vector<float> StateDict::get_floats(const std::string& key) const {
  const auto it = entries.find(key);
  RELAXCC_ENFORCE(it != entries.end(), InvalidArgument, "state dict: no entry '", key, "'");
  RELAXCC_ENFORCE(it->second.size() % sizeof(float) == 0, InvalidArgument, "state dict: entry '",
                  key, "' is not a float array");
  std::vector<float> out(it->second.size() / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), it->second.data(), it->second.size());
  return out;
}

void StateDict::put_int(const std::string& key, int64_t value) {
  std::vector<std::byte> bytes(sizeof(value));
  std::memcpy(bytes.data(), &value, sizeof(value));
  entries[key] = std::move(bytes);
}

int64_t StateDict::get_int(const std::string& key) const {
  const auto it = entries.find(key);
  RELAXCC_ENFORCE(it != entries.end() && it->second.size() == sizeof(int64_t), InvalidArgument,
                  "state dict: no integer entry '", key, "'");
  int64_t v;
  std::memcpy(&v, it->second.data(), sizeof(v));
  return v;
}

void StateDict::put_ints(const std::string& key, const std::vector<int64_t>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(int64_t));
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  entries[key] = std::move(bytes);
}

std::vector<int64_t> StateDict::get_ints(const std::string& key) const {
  const auto it = entries.find(key);
  RELAXCC_ENFORCE(it != entries.end(), InvalidArgument, "state dict: no entry '", key, "'");
  RELAXCC_ENFORCE(it->second.size() % sizeof(int64_t) == 0, InvalidArgument, "state dict: entry '",
                  key, "' is not an integer array");
  std::vector<int64_t> out(it->second.size() / sizeof(int64_t));
  if (!out.empty()) std::memcpy(out.data(), it->second.data(), it->second.size());
  return out;
}

namespace {
constexpr uint32_t kMagic = 0x44535852;  // "RXSD"

void append(std::vector<std::byte>& out, const void* p, size_t n) {
  const auto* b = static_cast<const std::byte*>(p);
  out.insert(out.end(), b, b + n);
}
}  // namespace

std::vector<std::byte> StateDict::serialize() const {
  std::vector<std::byte> out;
  append(out, &kMagic, 4);
  append(out, &version, 4);
  const uint64_t count = entries.size();
  append(out, &count, 8);
  for (const auto& [key, value] : entries) {
    const uint64_t klen = key.size(), vlen = value.size();
    append(out, &klen, 8);
    append(out, key.data(), key.size());
    append(out, &vlen, 8);
    append(out, value.data(), value.size());
  }
  return out;
}

StateDict StateDict::deserialize(const std::vector<std::byte>& bytes) {
  size_t pos = 0;
  auto take = [&](void* dst, size_t n) {
    RELAXCC_ENFORCE(n <= bytes.size() - pos, CorruptPayload, "state dict: truncated at byte ", pos);
    if (n) std::memcpy(dst, bytes.data() + pos, n);
    pos += n;
  };
  uint32_t magic = 0;
  StateDict sd;
  take(&magic, 4);
  RELAXCC_ENFORCE_EQ(magic, kMagic, CorruptPayload, "state dict magic");
  take(&sd.version, 4);
  RELAXCC_ENFORCE_EQ(sd.version, kVersion, Unsupported, "state dict version");
  uint64_t count = 0;
  take(&count, 8);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t klen = 0, vlen = 0;
    take(&klen, 8);
    RELAXCC_ENFORCE(klen <= bytes.size() - pos, CorruptPayload, "state dict: key length");
    std::string key(klen, '\0');
    take(key.data(), klen);
    take(&vlen, 8);
    RELAXCC_ENFORCE(vlen <= bytes.size() - pos, CorruptPayload, "state dict: value length");
    std::vector<std::byte> value(vlen);
    take(value.data(), vlen);
    sd.entries.emplace(std::move(key), std::move(value));
  }
  RELAXCC_ENFORCE_EQ(pos, bytes.size(), CorruptPayload, "state dict: trailing bytes");
  return sd;
}

}  // namespace relaxcc
