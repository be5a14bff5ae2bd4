#include "relaxcc/kernels/payload_packing.h"

#include <zstd.h>

#include <cstring>

#include "relaxcc/errors.h"

namespace relaxcc::kernels {

namespace {

// One compression context per thread: zstd's contexts are not thread-safe,
// and making one per call costs more than packing a small payload.
ZSTD_CCtx* compression_context() {
  struct Owner {
    ZSTD_CCtx* cctx = ZSTD_createCCtx();
    ~Owner() { ZSTD_freeCCtx(cctx); }
  };
  thread_local Owner owner;
  RELAXCC_ENFORCE(owner.cctx != nullptr, InternalError, "pack_payload: ZSTD_createCCtx failed");
  return owner.cctx;
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
  ZSTD_CCtx* cctx = compression_context();
  ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, kPackLevel);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1);
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
  const unsigned long long content = ZSTD_getFrameContentSize(frame, h.frame_bytes);
  RELAXCC_ENFORCE(content == h.raw_bytes, CorruptPayload,
                  "packed payload: the zstd frame's content size is ",
                  content == ZSTD_CONTENTSIZE_UNKNOWN ? std::string("unknown")
                  : content == ZSTD_CONTENTSIZE_ERROR ? std::string("unreadable")
                                                      : std::to_string(content),
                  ", expected ", h.raw_bytes);
  const size_t got = ZSTD_decompress(raw.data(), raw.size(), frame, h.frame_bytes);
  RELAXCC_ENFORCE(!ZSTD_isError(got), CorruptPayload, "packed payload: zstd frame of ",
                  h.frame_bytes, " bytes: ", ZSTD_isError(got) ? ZSTD_getErrorName(got) : "");
  RELAXCC_ENFORCE_EQ(got, h.raw_bytes, CorruptPayload,
                     "packed payload: bytes the frame decoded to");
}

}  // namespace relaxcc::kernels
