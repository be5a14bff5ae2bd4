// StateDict: the per-rank, versioned state of an algorithm, optimizer or
// Reducer, for checkpoints. Entries are keyed by name. Algorithm state that
// belongs to a parameter is keyed by the parameter's flat offset, so plan
// rebuilds never invalidate it; state that belongs to a bucket's layout
// (error-feedback residuals, public copies of compressed gossip) loads only
// into the plan it was saved with, which the Reducer's own state_dict keeps
// (reducer.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace relaxcc {

struct StateDict {
  static constexpr uint32_t kVersion = 1;
  uint32_t version = kVersion;
  std::map<std::string, std::vector<std::byte>> entries;

  void put_floats(const std::string& key, const std::vector<float>& values);
  // Throws InvalidArgument for a missing key or a size that is not whole floats.
  std::vector<float> get_floats(const std::string& key) const;
  void put_int(const std::string& key, int64_t value);
  int64_t get_int(const std::string& key) const;
  void put_ints(const std::string& key, const std::vector<int64_t>& values);
  // Throws InvalidArgument for a missing key or a size that is not whole int64s.
  std::vector<int64_t> get_ints(const std::string& key) const;
  bool contains(const std::string& key) const { return entries.count(key) != 0; }

  // A self-describing byte string; deserialize throws CorruptPayload on
  // anything malformed and Unsupported for an unknown version.
  std::vector<std::byte> serialize() const;
  static StateDict deserialize(const std::vector<std::byte>& bytes);
};

}  // namespace relaxcc
