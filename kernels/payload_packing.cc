#include "relaxcc/kernels/payload_packing.h"

#include <zstd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "relaxcc/errors.h"

namespace relaxcc::kernels {

namespace {

// One zstd context of each kind per thread: they are not thread-safe, and
// making one per call costs more than packing a small payload.
template <typename Ctx, Ctx* (*create)(), size_t (*release)(Ctx*)>
Ctx* thread_context(const char* what) {
  struct Owner {
    Ctx* ctx = create();
    ~Owner() { release(ctx); }
  };
  thread_local Owner owner;
  RELAXCC_ENFORCE(owner.ctx != nullptr, InternalError, what, ": zstd could not make a context");
  return owner.ctx;
}

std::string hex32(uint32_t v) {
  char b[9];
  std::snprintf(b, sizeof b, "%08x", v);
  return b;
}

void check_zstd(size_t rc, const char* call) {
  RELAXCC_ENFORCE(!ZSTD_isError(rc), InternalError, "pack_payload: ", call,
                  " failed: ", ZSTD_isError(rc) ? ZSTD_getErrorName(rc) : "");
}

PackedHeader read_packed_header(std::span<const std::byte> packed) {
  RELAXCC_ENFORCE(packed.size() >= sizeof(PackedHeader), CorruptPayload,
                  "packed payload: expected at least a ", sizeof(PackedHeader),
                  "-byte header, got ", packed.size(), " bytes");
  PackedHeader h;
  std::memcpy(&h, packed.data(), sizeof(h));
  RELAXCC_ENFORCE_EQ(h.magic, kPackedMagic, CorruptPayload, "packed payload: magic");
  RELAXCC_ENFORCE_EQ(h.version, kPackedVersion, CorruptPayload, "packed payload: version");
  RELAXCC_ENFORCE_EQ(h.reserved, 0, CorruptPayload, "packed payload: reserved field");
  RELAXCC_ENFORCE_EQ(h.frame_bytes, packed.size() - sizeof(PackedHeader), CorruptPayload,
                     "packed payload: zstd frame bytes in the header against the bytes after it");
  return h;
}

}  // namespace

size_t packed_bound(size_t raw_bytes) {
  return sizeof(PackedHeader) + ZSTD_compressBound(raw_bytes);
}

size_t pack_payload(std::span<const std::byte> raw, std::span<std::byte> out) {
  RELAXCC_ENFORCE_GE(out.size(), packed_bound(raw.size()), InvalidArgument,
                     "pack_payload: output bytes for a payload of ", raw.size(), " bytes");
  ZSTD_CCtx* cctx = thread_context<ZSTD_CCtx, ZSTD_createCCtx, ZSTD_freeCCtx>("pack_payload");
  check_zstd(ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters), "ZSTD_CCtx_reset");
  check_zstd(ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, kPackLevel),
             "ZSTD_CCtx_setParameter");
  check_zstd(ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1), "ZSTD_CCtx_setParameter");
  check_zstd(ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1), "ZSTD_CCtx_setParameter");
  const size_t frame = ZSTD_compress2(cctx, out.data() + sizeof(PackedHeader),
                                      out.size() - sizeof(PackedHeader), raw.data(), raw.size());
  RELAXCC_ENFORCE(!ZSTD_isError(frame), InternalError, "pack_payload: zstd failed on ", raw.size(),
                  " bytes: ", ZSTD_getErrorName(frame));
  PackedHeader h;
  h.raw_bytes = raw.size();
  h.frame_bytes = frame;
  std::memcpy(out.data(), &h, sizeof(h));
  return sizeof(PackedHeader) + frame;
}

size_t unpacked_size(std::span<const std::byte> packed) {
  return static_cast<size_t>(read_packed_header(packed).raw_bytes);
}

void unpack_payload(std::span<const std::byte> packed, std::span<std::byte> raw) {
  const PackedHeader h = read_packed_header(packed);
  RELAXCC_ENFORCE_EQ(h.raw_bytes, raw.size(), CorruptPayload,
                     "packed payload: unpacked bytes in the header against the payload expected");
  const std::byte* frame = packed.data() + sizeof(PackedHeader);
  // Exactly one frame, with its content size and a checksum, as pack_payload
  // writes it (RFC 8878: the magic number, then the frame header descriptor,
  // whose bit 2 is the checksum flag); no skippable or trailing frames.
  uint32_t magic = 0;
  if (h.frame_bytes >= 5) std::memcpy(&magic, frame, sizeof(magic));
  RELAXCC_ENFORCE(magic == ZSTD_MAGICNUMBER, CorruptPayload,
                  "packed payload: expected a zstd frame (magic 0xfd2fb528), found ",
                  h.frame_bytes < 5 ? std::string("too few bytes") : "magic 0x" + hex32(magic));
  RELAXCC_ENFORCE((static_cast<unsigned>(frame[4]) & 4u) != 0, CorruptPayload,
                  "packed payload: the zstd frame has no checksum, expected one");
  const unsigned long long content = ZSTD_getFrameContentSize(frame, h.frame_bytes);
  RELAXCC_ENFORCE(content == h.raw_bytes, CorruptPayload,
                  "packed payload: the zstd frame's content size is ",
                  content == ZSTD_CONTENTSIZE_UNKNOWN ? std::string("unknown")
                  : content == ZSTD_CONTENTSIZE_ERROR ? std::string("unreadable")
                                                      : std::to_string(content),
                  ", expected ", h.raw_bytes);
  const size_t frame_size = ZSTD_findFrameCompressedSize(frame, h.frame_bytes);
  RELAXCC_ENFORCE(!ZSTD_isError(frame_size) && frame_size == h.frame_bytes, CorruptPayload,
                  "packed payload: expected one zstd frame of ", h.frame_bytes, " bytes, found ",
                  ZSTD_isError(frame_size) ? std::string(ZSTD_getErrorName(frame_size))
                                           : std::to_string(frame_size) + " bytes");
  ZSTD_DCtx* dctx = thread_context<ZSTD_DCtx, ZSTD_createDCtx, ZSTD_freeDCtx>("unpack_payload");
  const size_t got = ZSTD_decompressDCtx(dctx, raw.data(), raw.size(), frame, h.frame_bytes);
  RELAXCC_ENFORCE(!ZSTD_isError(got), CorruptPayload, "packed payload: zstd frame of ",
                  h.frame_bytes, " bytes: ", ZSTD_isError(got) ? ZSTD_getErrorName(got) : "");
  RELAXCC_ENFORCE_EQ(got, h.raw_bytes, CorruptPayload,
                     "packed payload: bytes the frame decoded to");
}

}  // namespace relaxcc::kernels
