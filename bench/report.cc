#include "report.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "relaxcc/errors.h"

namespace relaxcc::bench {

Row& Row::set(const std::string& key, const std::string& value) {
  fields_.emplace_back(key, value);
  return *this;
}
Row& Row::set(const std::string& key, int64_t value) {
  fields_.emplace_back(key, value);
  return *this;
}
Row& Row::set(const std::string& key, double value) {
  fields_.emplace_back(key, value);
  return *this;
}

namespace {
void write_string(std::ostringstream& os, const std::string& s) {
  os << '"';
  for (char c : s) {
    if (c == '"' || c == '\\')
      os << '\\' << c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      os << buf;
    } else {
      os << c;
    }
  }
  os << '"';
}
}  // namespace

std::string Row::to_json() const {
  std::ostringstream os;
  os << '{';
  bool first = true;
  for (const auto& [key, value] : fields_) {
    if (!first) os << ", ";
    first = false;
    write_string(os, key);
    os << ": ";
    if (const auto* s = std::get_if<std::string>(&value))
      write_string(os, *s);
    else if (const auto* i = std::get_if<int64_t>(&value))
      os << *i;
    else {
      const double d = std::get<double>(value);
      if (std::isfinite(d)) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.6g", d);
        os << buf;
      } else {
        os << "null";
      }
    }
  }
  os << '}';
  return os.str();
}

Report::Report(bool is_root, const std::string& json_path) : is_root_(is_root) {
  if (is_root_ && !json_path.empty()) {
    json_.open(json_path, std::ios::out | std::ios::app);
    RELAXCC_ENFORCE(json_.good(), InvalidArgument, "cannot open --json file '", json_path, "'");
  }
}

void Report::print(const std::string& line) {
  if (!is_root_) return;
  std::cout << line << std::endl;
}

void Report::add(const Row& row) {
  if (is_root_ && json_.is_open()) json_ << row.to_json() << '\n' << std::flush;
}

std::string format_bytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30) && bytes % (int64_t{1} << 30) == 0)
    return std::to_string(bytes >> 30) + "G";
  if (bytes >= (int64_t{1} << 20) && bytes % (int64_t{1} << 20) == 0)
    return std::to_string(bytes >> 20) + "M";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + "K";
  return std::to_string(bytes);
}

}  // namespace relaxcc::bench
