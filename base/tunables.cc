#include "relaxcc/tunables.h"

#include <cstdlib>
#include <sstream>

#include "relaxcc/errors.h"
#include "relaxcc/hash.h"

namespace relaxcc {

int64_t parse_size(const std::string& text) {
  size_t pos = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &pos);
  } catch (const std::exception&) {
    RELAXCC_THROW(InvalidArgument, "cannot parse size '", text, "'");
  }
  const std::string suffix = text.substr(pos);
  int64_t scale = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KiB")
    scale = int64_t{1} << 10;
  else if (suffix == "M" || suffix == "MiB")
    scale = int64_t{1} << 20;
  else if (suffix == "G" || suffix == "GiB")
    scale = int64_t{1} << 30;
  else if (!suffix.empty())
    RELAXCC_THROW(InvalidArgument, "bad size suffix in '", text, "'");
  return value * scale;
}

namespace {

void parse_value(const char* env, const std::string& text, int64_t& out) {
  try {
    out = parse_size(text);
  } catch (const InvalidArgument&) {
    RELAXCC_THROW(InvalidArgument, env, "='", text, "': expected an integer with optional K/M/G");
  }
}
[[maybe_unused]] void parse_value(const char* env, const std::string& text, double& out) {
  char* end = nullptr;
  out = std::strtod(text.c_str(), &end);
  RELAXCC_ENFORCE(end != text.c_str() && *end == '\0', InvalidArgument, env, "='", text,
                  "': expected a number");
}
void parse_value(const char*, const std::string& text, std::string& out) {
  out = text;
}

template <typename T>
std::string format_value(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// A field and a separator byte.
void mix_field(Fnv1a& h, const std::string& s) {
  h.bytes(s).byte(0xff);
}

}  // namespace

Tunables Tunables::from_env() {
  Tunables t;
#define RELAXCC_TUNABLE(member, env, type, def, scope, doc) \
  if (const char* v = std::getenv(env)) parse_value(env, v, t.member);
#include "relaxcc/tunables.def"
#undef RELAXCC_TUNABLE
  return t;
}

std::vector<TunableInfo> Tunables::describe() const {
  std::vector<TunableInfo> out;
#define RELAXCC_TUNABLE(member, env, type, def, scope, doc)                                     \
  out.push_back(TunableInfo{#member, env, #type, format_value(type{def}), format_value(member), \
                            std::getenv(env) != nullptr, std::string(#scope) == "Agree", doc});
#include "relaxcc/tunables.def"
#undef RELAXCC_TUNABLE
  return out;
}

uint64_t Tunables::agreement_hash() const {
  Fnv1a h;
#define RELAXCC_TUNABLE(member, env, type, def, scope, doc) \
  if (std::string(#scope) == "Agree") {                     \
    mix_field(h, env);                                      \
    mix_field(h, format_value(member));                     \
  }
#include "relaxcc/tunables.def"
#undef RELAXCC_TUNABLE
  return h.value();
}

}  // namespace relaxcc
