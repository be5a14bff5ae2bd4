// Tunables: every knob is one line of tunables.def with its RELAXCC_* name,
// default and doc. A Tunables value is plain data: read it from the
// environment once (Tunables::from_env()) and pass it, or a modified copy,
// in options structs. Nothing reads the environment behind a caller's back.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace relaxcc {

struct TunableInfo {
  std::string member;
  std::string env_name;
  std::string type;
  std::string default_value;
  std::string value;  // current value, formatted
  bool from_env;      // value came from the environment
  bool agree;         // must match across ranks
  std::string doc;
};

struct Tunables {
#define RELAXCC_TUNABLE(member, env, type, def, scope, doc) type member = def;
#include "relaxcc/tunables.def"
#undef RELAXCC_TUNABLE

  // Defaults overridden by every RELAXCC_* variable that is set. Throws
  // InvalidArgument naming the variable when a value does not parse.
  static Tunables from_env();
  // Name, default, value and doc of every tunable, in definition order.
  std::vector<TunableInfo> describe() const;
  // FNV-1a hash of the Agree-scoped values; equal on ranks that must agree.
  uint64_t agreement_hash() const;
};

// Parses "64", "256K", "1M", "2G" (powers of 1024). Throws InvalidArgument.
int64_t parse_size(const std::string& text);

}  // namespace relaxcc
