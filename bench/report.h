// Result rows of relaxcc-bench: an nccl-tests style table on rank 0's stdout
// and, optionally, JSON Lines (one object per row) in a file.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace relaxcc::bench {

// One JSON row: ordered keys with string, integer or number values.
class Row {
 public:
  Row& set(const std::string& key, const std::string& value);
  Row& set(const std::string& key, const char* value) { return set(key, std::string(value)); }
  Row& set(const std::string& key, int64_t value);
  Row& set(const std::string& key, int value) { return set(key, static_cast<int64_t>(value)); }
  Row& set(const std::string& key, double value);
  std::string to_json() const;

 private:
  std::vector<std::pair<std::string, std::variant<std::string, int64_t, double>>> fields_;
};

class Report {
 public:
  // `json_path` empty: no JSON file. Only `is_root` writes anything.
  Report(bool is_root, const std::string& json_path);
  void print(const std::string& line);
  void add(const Row& row);
  bool is_root() const { return is_root_; }

 private:
  bool is_root_;
  std::ofstream json_;
};

// "1.50 KiB"-free compact sizes for tables: 1024 -> "1K", 1048576 -> "1M".
std::string format_bytes(int64_t bytes);

}  // namespace relaxcc::bench
