// Lossless packing of compressor payloads with zstd, for links where bytes
// cost more than CPU time.
//
// A min-max code of bell-shaped data is far from uniform: at 2 bits, the two
// inner levels take most values (about 1.2 bits of entropy per 2-bit code
// for normal data, 1.6 for uniform data), and zstd's entropy stage recovers
// the difference. Packing changes no value: unpack() returns the payload
// byte for byte, so an algorithm's trajectory is the same with or without it.
//
// Packed frame: a 24-byte PackedHeader, then one zstd frame (level
// kPackLevel, with zstd's content size and xxhash checksum).
//
// Decoder contract, as for compressor payloads: the packed bytes are not
// trusted. Anything wrong (magic, version, sizes, a zstd frame that fails,
// whose content size or checksum disagrees, or that decodes to a size other
// than the header's) throws CorruptPayload naming what was expected and what
// was found. unpack_payload() writes within `raw` only, and after a
// CorruptPayload `raw` holds no payload (decode it never). Host memory only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace relaxcc::kernels {

inline constexpr uint32_t kPackedMagic = 0x5a435852;  // "RXCZ"
inline constexpr uint16_t kPackedVersion = 1;
inline constexpr int kPackLevel = 1;  // zstd's fastest standard level

struct PackedHeader {
  uint32_t magic = kPackedMagic;
  uint16_t version = kPackedVersion;
  uint16_t reserved = 0;     // 0
  uint64_t raw_bytes = 0;    // the payload's size
  uint64_t frame_bytes = 0;  // the zstd frame's size: the packed size is 24 + frame_bytes
};
static_assert(sizeof(PackedHeader) == 24);

// The most bytes pack() writes for a payload of `raw_bytes`.
size_t packed_bound(size_t raw_bytes);

// Packs `raw` into `out` (at least packed_bound(raw.size()) bytes, else
// InvalidArgument) and returns the packed size.
size_t pack_payload(std::span<const std::byte> raw, std::span<std::byte> out);

// The payload size a packed frame unpacks to, from its header; throws
// CorruptPayload for a header that is wrong or disagrees with `packed`'s size.
size_t unpacked_size(std::span<const std::byte> packed);

// Unpacks `packed` into `raw`, whose size must equal unpacked_size(packed)
// (CorruptPayload otherwise, naming both).
void unpack_payload(std::span<const std::byte> packed, std::span<std::byte> raw);

}  // namespace relaxcc::kernels
