// Fnv1a: the 64-bit FNV-1a hash relaxcc uses wherever ranks compare what
// they hold (ring layouts, bucket plans, Agree-scoped tunables, group ids).
// Stable within one build of the library; not for security.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace relaxcc {

class Fnv1a {
 public:
  Fnv1a& byte(unsigned char b) {
    h_ ^= b;
    h_ *= 1099511628211ull;
    return *this;
  }
  Fnv1a& bytes(std::string_view s) {
    for (unsigned char c : s) byte(c);
    return *this;
  }
  // The eight bytes of `v`, least significant first.
  Fnv1a& u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) byte(static_cast<unsigned char>(v >> (8 * i)));
    return *this;
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 14695981039346656037ull;
};

}  // namespace relaxcc
