// The 64-bit ucp tag of relaxcc's messages, and the masks that match them.
//
//   bits 63..62  space       collective, point-to-point or control traffic
//   bits 61..48  generation  of the endpoint set (a communicator's incarnation),
//                            so messages of an earlier set never match
//   bits 47..32  source      the sender's rank (at most 65535 ranks)
//   bits 31..0   tag         the caller's tag (the engine's per-lane tags)
//
// A receive matches all 64 bits, or all but the source bits (any source).
#pragma once

#include <cstdint>

namespace relaxcc::ucx {

enum class TagSpace : uint8_t { kCollective = 0, kPointToPoint = 1, kControl = 2 };

// A receive from any source (the source comes back in its completion).
inline constexpr int kAnySource = -1;

namespace tag_layout {

inline constexpr int kSpaceShift = 62;
inline constexpr int kGenerationShift = 48;
inline constexpr int kSourceShift = 32;
inline constexpr uint64_t kGenerationMask = (uint64_t{1} << 14) - 1;
inline constexpr uint64_t kSourceMask = 0xFFFF;
inline constexpr uint64_t kTagMask = 0xFFFFFFFF;
inline constexpr int kMaxRanks = static_cast<int>(kSourceMask) + 1;
inline constexpr uint32_t kMaxGeneration = static_cast<uint32_t>(kGenerationMask);

constexpr uint64_t make(TagSpace space, uint32_t generation, int source, uint32_t tag) {
  return (static_cast<uint64_t>(space) << kSpaceShift) |
         ((generation & kGenerationMask) << kGenerationShift) |
         ((static_cast<uint64_t>(source) & kSourceMask) << kSourceShift) | tag;
}
constexpr int source(uint64_t t) {
  return static_cast<int>((t >> kSourceShift) & kSourceMask);
}
constexpr uint32_t user_tag(uint64_t t) {
  return static_cast<uint32_t>(t & kTagMask);
}
constexpr TagSpace space(uint64_t t) {
  return static_cast<TagSpace>(t >> kSpaceShift);
}
constexpr uint32_t generation(uint64_t t) {
  return static_cast<uint32_t>((t >> kGenerationShift) & kGenerationMask);
}
// The mask of a receive from `source` (kAnySource: every source).
constexpr uint64_t mask(int source) {
  return source == kAnySource ? ~(kSourceMask << kSourceShift) : ~uint64_t{0};
}

static_assert(source(make(TagSpace::kControl, 5, 65535, 7)) == 65535);
static_assert(user_tag(make(TagSpace::kControl, 5, 65535, 0xFFFFFFFF)) == 0xFFFFFFFF);
static_assert(generation(make(TagSpace::kPointToPoint, kMaxGeneration, 3, 1)) == kMaxGeneration);
static_assert(space(make(TagSpace::kControl, kMaxGeneration, 65535, 0xFFFFFFFF)) ==
              TagSpace::kControl);
static_assert((make(TagSpace::kCollective, 1, 2, 3) & mask(kAnySource)) ==
              (make(TagSpace::kCollective, 1, 9, 3) & mask(kAnySource)));

}  // namespace tag_layout
}  // namespace relaxcc::ucx
