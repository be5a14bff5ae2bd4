#include "relaxcc/kernels/compressor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/topk.h"
#include "kernels/cuda/cuda_kernels.h"
#include "relaxcc/errors.h"
#include "relaxcc/kernels/philox.h"
#include "relaxcc/thread_pool.h"

namespace relaxcc::kernels {

const char* compressor_name(CompressorKind kind) noexcept {
  switch (kind) {
    case CompressorKind::f16:
      return "f16";
    case CompressorKind::bf16:
      return "bf16";
    case CompressorKind::minmax:
      return "minmax";
    case CompressorKind::sign:
      return "sign";
    case CompressorKind::topk:
      return "topk";
    case CompressorKind::randomk:
      return "randomk";
    case CompressorKind::cocktail:
      return "cocktail";
  }
  return "unknown";
}

void CompressorConfig::validate() const {
  const int kind_value = static_cast<int>(kind);
  RELAXCC_ENFORCE(kind_value >= 1 && kind_value <= 7, InvalidArgument,
                  "CompressorConfig.kind must be one of f16 (1), bf16, minmax, sign, topk, "
                  "randomk, cocktail (7), got ",
                  kind_value);
  const char* name = compressor_name(kind);
  const bool quantizes = kind == CompressorKind::minmax || kind == CompressorKind::cocktail;
  const bool chunked = quantizes || kind == CompressorKind::sign;
  const bool sparse = kind == CompressorKind::topk || kind == CompressorKind::randomk ||
                      kind == CompressorKind::cocktail;
  const bool random = kind == CompressorKind::randomk || kind == CompressorKind::cocktail;
  RELAXCC_ENFORCE(!quantizes || bits == 8 || bits == 4 || bits == 2 || bits == 1, InvalidArgument,
                  name, ": CompressorConfig.bits must be 8, 4, 2 or 1, got ", bits);
  RELAXCC_ENFORCE(!chunked || (chunk >= 1 && chunk <= (int64_t{1} << 30)), InvalidArgument, name,
                  ": CompressorConfig.chunk must be in [1, 2^30], got ", chunk);
  // Both enums travel in the header, so every kind checks them.
  RELAXCC_ENFORCE(rounding == Rounding::nearest || rounding == Rounding::stochastic,
                  InvalidArgument, name,
                  ": CompressorConfig.rounding must be nearest (0) or stochastic (1), got ",
                  static_cast<int>(rounding));
  RELAXCC_ENFORCE(random_mode == RandomKMode::stratified || random_mode == RandomKMode::rolling,
                  InvalidArgument, name,
                  ": CompressorConfig.random_mode must be stratified (0) or rolling (1), got ",
                  static_cast<int>(random_mode));
  RELAXCC_ENFORCE(!sparse || (ratio > 0 && ratio <= 1), InvalidArgument, name,
                  ": CompressorConfig.ratio must be in (0, 1], got ", ratio);
  // The rolling stride round(1 / ratio) travels in the header's 32-bit chunk field.
  RELAXCC_ENFORCE(
      !random || random_mode != RandomKMode::rolling || ratio >= 1.0 / static_cast<double>(1 << 30),
      InvalidArgument, name,
      ": CompressorConfig.ratio must be in [2^-30, 1] with random_mode rolling (a stride of at "
      "most 2^30), got ",
      ratio);
  RELAXCC_ENFORCE(!sparse || keep >= 0, InvalidArgument, name,
                  ": CompressorConfig.keep must be >= 0, got ", keep);
  RELAXCC_ENFORCE(kind != CompressorKind::cocktail || (topk_ratio > 0 && topk_ratio <= 1),
                  InvalidArgument, "cocktail: CompressorConfig.topk_ratio must be in (0, 1], got ",
                  topk_ratio);
}

namespace {

constexpr size_t kHeader = sizeof(PayloadHeader);

// memcpy that accepts empty ranges with null pointers (empty vectors).
void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

int64_t fraction_of(int64_t n, double ratio) {
  if (n <= 0) return 0;
  return std::clamp<int64_t>(static_cast<int64_t>(std::ceil(ratio * static_cast<double>(n))), 1, n);
}

int64_t rolling_stride(double ratio) {
  return std::max<int64_t>(1, std::llround(1.0 / ratio));
}

int64_t rolling_count(int64_t n, int64_t stride, uint64_t step) {
  const int64_t offset = static_cast<int64_t>(step % static_cast<uint64_t>(stride));
  return offset < n ? (n - offset + stride - 1) / stride : 0;
}

int64_t random_count(int64_t n, const CompressorConfig& c) {
  if (c.random_mode == RandomKMode::rolling)
    return rolling_count(n, rolling_stride(c.ratio), c.step);
  return c.keep > 0 && c.kind == CompressorKind::randomk ? std::min(c.keep, n)
                                                         : fraction_of(n, c.ratio);
}

// The selection of randomk (and of cocktail's first stage), ascending: calls
// fn(j, i) for its k indices i, one drawn from Philox(seed, step) in each of
// k equal blocks, or every stride-th from step mod stride.
template <typename Fn>
void for_random_indices(int64_t n, int64_t k, RandomKMode mode, int64_t stride, uint64_t seed,
                        uint64_t step, Fn&& fn) {
  if (mode == RandomKMode::rolling) {
    const int64_t offset = static_cast<int64_t>(step % static_cast<uint64_t>(stride));
    for (int64_t j = 0; j < k; ++j) fn(j, offset + j * stride);
    return;
  }
  for (int64_t b = 0; b < k; ++b)
    fn(b, static_cast<int64_t>(stratified_index(static_cast<uint64_t>(n), static_cast<uint64_t>(k),
                                                static_cast<uint64_t>(b), seed, step)));
}

std::vector<uint32_t> random_indices(int64_t n, int64_t k, RandomKMode mode, int64_t stride,
                                     uint64_t seed, uint64_t step) {
  std::vector<uint32_t> idx(static_cast<size_t>(k));
  for_random_indices(n, k, mode, stride, seed, step,
                     [&](int64_t j, int64_t i) { idx[j] = static_cast<uint32_t>(i); });
  return idx;
}

std::vector<uint32_t> random_indices(int64_t n, const CompressorConfig& c) {
  return random_indices(n, random_count(n, c), c.random_mode, rolling_stride(c.ratio), c.seed,
                        c.step);
}

int64_t chunk_count(int64_t n, int64_t chunk) {
  return (n + chunk - 1) / chunk;
}

// Bytes of a min-max body for n values.
size_t minmax_body(int64_t n, int bits, int64_t chunk) {
  if (n == 0) return 0;
  const int64_t full = n / chunk, last = n % chunk;
  const int64_t per_full = 8 + (chunk * bits + 7) / 8;
  return static_cast<size_t>(full * per_full + (last ? 8 + (last * bits + 7) / 8 : 0));
}

size_t sign_body(int64_t n, int64_t chunk) {
  if (n == 0) return 0;
  const int64_t full = n / chunk, last = n % chunk;
  return static_cast<size_t>(full * (4 + (chunk + 7) / 8) + (last ? 4 + (last + 7) / 8 : 0));
}

int64_t cocktail_kept(int64_t n, const CompressorConfig& c) {
  const int64_t k1 = random_count(n, c);
  if (k1 == 0) return 0;
  return c.keep > 0 ? std::min(c.keep, k1) : fraction_of(k1, c.topk_ratio);
}

// The header's implicit_stride for cocktail (0: its indices travel): set
// when top-k keeps the whole random selection.
uint16_t cocktail_implicit_stride(int64_t n, const CompressorConfig& c) {
  if (cocktail_kept(n, c) != random_count(n, c)) return 0;
  if (c.random_mode == RandomKMode::stratified) return 1;
  const int64_t stride = rolling_stride(c.ratio);
  return stride <= UINT16_MAX ? static_cast<uint16_t>(stride) : 0;
}

// Bytes of a cocktail body: k indices (unless implicit), then k values.
size_t cocktail_body(int64_t k, bool implicit, int bits, int64_t chunk) {
  return (implicit ? 0 : static_cast<size_t>(k) * 4) + minmax_body(k, bits, chunk);
}

int64_t topk_kept(int64_t n, const CompressorConfig& c) {
  return c.keep > 0 ? std::min(c.keep, n) : fraction_of(n, c.ratio);
}

size_t body_size(int64_t n, const CompressorConfig& c) {
  switch (c.kind) {
    case CompressorKind::f16:
    case CompressorKind::bf16:
      return static_cast<size_t>(n) * 2;
    case CompressorKind::minmax:
      return minmax_body(n, c.bits, c.chunk);
    case CompressorKind::sign:
      return sign_body(n, c.chunk);
    case CompressorKind::topk:
      return static_cast<size_t>(topk_kept(n, c)) * 8;
    case CompressorKind::randomk:
      return static_cast<size_t>(random_count(n, c)) * 4;
    case CompressorKind::cocktail:
      return cocktail_body(cocktail_kept(n, c), cocktail_implicit_stride(n, c) != 0, c.bits,
                           c.chunk);
  }
  return 0;
}

void check_f32(const TensorView& t, const char* what) {
  t.check_valid(what);
  RELAXCC_ENFORCE_EQ(t.dtype, DType::f32, InvalidArgument, what, ": compressors take f32 tensors");
}

void require_finite(const float* x, int64_t n, const char* what, int64_t index_base = 0,
                    const ExecContext& ctx = ExecContext::host()) {
  const int64_t i = cpu::first_non_finite(x, n, ctx);
  if (i >= 0)
    RELAXCC_THROW(InvalidArgument, what, ": element ", index_base + i, " is ", x[i],
                  "; compressors take finite values (check for overflow first)");
}

template <typename Fn>
void for_chunks(int64_t chunks, const ExecContext& ctx, Fn&& fn) {
  if (ctx.pool == nullptr || chunks < 8) {
    for (int64_t c = 0; c < chunks; ++c) fn(c);
    return;
  }
  ctx.pool->parallel_for(chunks, 4, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) fn(c);
  });
}

// ---- min-max body ---------------------------------------------------------

void encode_minmax(const float* x, int64_t n, const CompressorConfig& c, const ExecContext& ctx,
                   int64_t index_base, std::byte* out) {
  const int64_t chunks = chunk_count(n, c.chunk);
  const int64_t stride = 8 + (c.chunk * c.bits + 7) / 8;
  for_chunks(chunks, ctx, [&](int64_t ch) {
    const int64_t first = ch * c.chunk, len = std::min(c.chunk, n - first);
    const cpu::ChunkRange r = cpu::chunk_range(x + first, len);
    if (r.first_non_finite >= 0)
      require_finite(x + first, len, "minmax encode", index_base + first);
    // (x - min) * scale must be computable for every x of the chunk.
    RELAXCC_ENFORCE(
        std::isfinite(r.max - r.min), InvalidArgument, compressor_name(c.kind), " encode: chunk ",
        ch, " (elements from ", index_base + first, ") spans [", r.min, ", ", r.max,
        "], whose width overflows f32; compressors take chunks whose max - min is finite");
    const float scale = cpu::minmax_scale(r.min, r.max, c.bits);
    std::byte* p = out + ch * stride;
    std::memcpy(p, &r.min, 4);
    std::memcpy(p + 4, &scale, 4);
    cpu::quantize_chunk(x + first, len, r.min, scale, c.bits, c.rounding, ctx.rng.seed,
                        ctx.rng.offset, index_base + first,
                        reinterpret_cast<unsigned char*>(p + 8));
  });
}

// Throws CorruptPayload unless chunk `ch`'s (min, scale) decodes to finite
// values only (see the decoder contract in compressor.h).
void check_minmax_chunk(int64_t ch, float min, float scale, int bits, const char* what) {
  RELAXCC_ENFORCE(std::isfinite(min) && std::isfinite(scale), CorruptPayload, what,
                  " payload: chunk ", ch, " has min ", min, " and scale ", scale,
                  " (expected both finite)");
  const float top = cpu::minmax_decoded_max(min, scale, bits);
  RELAXCC_ENFORCE(std::isfinite(top), CorruptPayload, what, " payload: chunk ", ch, " with min ",
                  min, " and scale ", scale, " decodes up to min + ", (1u << bits) - 1u,
                  " / |scale| = ", top,
                  " (expected a finite decoded range; a scale this small is corrupt)");
}

void decode_minmax(const std::byte* body, int64_t n, int bits, int64_t chunk, float* out,
                   bool accumulate, const ExecContext& ctx, const char* what) {
  const int64_t chunks = chunk_count(n, chunk);
  const int64_t stride = 8 + (chunk * bits + 7) / 8;
  // Validate every chunk header before writing anything.
  for (int64_t ch = 0; ch < chunks; ++ch) {
    float min, scale;
    std::memcpy(&min, body + ch * stride, 4);
    std::memcpy(&scale, body + ch * stride + 4, 4);
    check_minmax_chunk(ch, min, scale, bits, what);
  }
  for_chunks(chunks, ctx, [&](int64_t ch) {
    const int64_t first = ch * chunk, len = std::min(chunk, n - first);
    float min, scale;
    std::memcpy(&min, body + ch * stride, 4);
    std::memcpy(&scale, body + ch * stride + 4, 4);
    cpu::dequantize_chunk(reinterpret_cast<const unsigned char*>(body + ch * stride + 8), len, min,
                          scale, bits, out + first, accumulate);
  });
}

// ---- sign body ------------------------------------------------------------

void encode_sign(const float* x, int64_t n, int64_t chunk, std::byte* out) {
  const int64_t chunks = chunk_count(n, chunk);
  const int64_t stride = 4 + (chunk + 7) / 8;
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const int64_t first = ch * chunk, len = std::min(chunk, n - first);
    const double sum = cpu::sum_of_squares(x + first, len);
    // A non-finite element makes the sum non-finite: only then look for it.
    if (!std::isfinite(sum)) require_finite(x + first, len, "sign", first);
    const float scale = static_cast<float>(std::sqrt(sum / static_cast<double>(len)));
    std::byte* p = out + ch * stride;
    std::memcpy(p, &scale, 4);
    cpu::sign_pack(x + first, len, reinterpret_cast<unsigned char*>(p + 4));
  }
}

void decode_sign(const std::byte* body, int64_t n, int64_t chunk, float* out, bool accumulate) {
  const int64_t chunks = chunk_count(n, chunk);
  const int64_t stride = 4 + (chunk + 7) / 8;
  for (int64_t ch = 0; ch < chunks; ++ch) {
    float scale;
    std::memcpy(&scale, body + ch * stride, 4);
    RELAXCC_ENFORCE(std::isfinite(scale) && scale >= 0.0f, CorruptPayload, "sign payload: chunk ",
                    ch, " has scale ", scale, " (expected finite and >= 0)");
  }
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const int64_t first = ch * chunk, len = std::min(chunk, n - first);
    float scale;
    std::memcpy(&scale, body + ch * stride, 4);
    cpu::sign_unpack(reinterpret_cast<const unsigned char*>(body + ch * stride + 4), len, scale,
                     out + first, accumulate);
  }
}

// ---- sparse bodies --------------------------------------------------------

void check_indices(const uint32_t* idx, int64_t k, int64_t n, const char* what) {
  int64_t prev = -1;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t i = idx[j];
    RELAXCC_ENFORCE(i < n, CorruptPayload, what, " payload: index ", i, " at position ", j,
                    " is out of range for ", n, " elements");
    RELAXCC_ENFORCE(i > prev, CorruptPayload, what, " payload: index ", i, " at position ", j,
                    i == prev ? " is a duplicate" : " is out of order");
    prev = i;
  }
}

void check_values(const float* vals, int64_t k, const char* what) {
  for (int64_t j = 0; j < k; ++j)
    RELAXCC_ENFORCE(std::isfinite(vals[j]), CorruptPayload, what, " payload: value ", j, " is ",
                    vals[j], " (expected finite)");
}

// Writes the (validated) sparse values: zeros elsewhere unless `accumulate`.
void scatter(const uint32_t* idx, const float* vals, int64_t k, float* out, int64_t n,
             bool accumulate) {
  if (!accumulate) std::fill(out, out + n, 0.0f);
  for (int64_t j = 0; j < k; ++j) out[idx[j]] = accumulate ? out[idx[j]] + vals[j] : vals[j];
}

// An f16 or bf16 value is Inf or NaN when its exponent bits are all ones.
constexpr uint16_t half_exponent_mask(CompressorKind kind) {
  return kind == CompressorKind::f16 ? 0x7c00 : 0x7f80;
}

int64_t first_non_finite_half(const uint16_t* bits, int64_t n, CompressorKind kind) {
  const uint16_t mask = half_exponent_mask(kind);
  bool any = false;
  for (int64_t i = 0; i < n; ++i) any |= (bits[i] & mask) == mask;  // branch-free: vectorizes
  if (!any) return -1;
  for (int64_t i = 0; i < n; ++i)
    if ((bits[i] & mask) == mask) return i;
  return -1;
}

PayloadHeader header_for(int64_t n, const CompressorConfig& c) {
  PayloadHeader h;
  h.kind = c.kind;
  h.bits = static_cast<uint8_t>(
      c.kind == CompressorKind::minmax || c.kind == CompressorKind::cocktail ? c.bits : 0);
  h.rounding = c.rounding;
  h.random_mode = c.random_mode;
  h.chunk = static_cast<uint32_t>(c.chunk);
  if (c.kind == CompressorKind::randomk)
    h.chunk =
        c.random_mode == RandomKMode::rolling ? static_cast<uint32_t>(rolling_stride(c.ratio)) : 0;
  else if (c.kind == CompressorKind::topk || c.kind == CompressorKind::f16 ||
           c.kind == CompressorKind::bf16)
    h.chunk = 0;
  if (c.kind == CompressorKind::cocktail) h.implicit_stride = cocktail_implicit_stride(n, c);
  h.n = n;
  h.k = kept_elements(n, c);
  h.seed = c.seed;
  h.step = c.step;
  return h;
}

void decode_impl(std::span<const std::byte> payload, const TensorView& out, bool accumulate,
                 const ExecContext& ctx) {
  check_f32(out, "decode output");
  if (ctx.device.is_cuda()) return cuda::decode(payload, out, accumulate, ctx.stream);
  const PayloadHeader h = read_header(payload);
  // The output is the caller's; a payload that disagrees with it is corrupt.
  RELAXCC_ENFORCE_EQ(h.n, out.numel, CorruptPayload, compressor_name(h.kind),
                     " payload: element count vs the output's");
  const std::byte* body = payload.data() + kHeader;
  auto* o = out.as<float>();
  switch (h.kind) {
    case CompressorKind::f16:
    case CompressorKind::bf16: {
      const auto* bits = reinterpret_cast<const uint16_t*>(body);
      const int64_t bad = cpu::halves_finite(bits, h.n, h.kind == CompressorKind::bf16)
                              ? -1
                              : first_non_finite_half(bits, h.n, h.kind);
      if (bad >= 0) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%04x", static_cast<unsigned>(bits[bad]));
        RELAXCC_THROW(CorruptPayload, compressor_name(h.kind), " payload: element ", bad,
                      " has bits ", hex,
                      ", an Inf or NaN (expected a finite value: encode never writes these)");
      }
      if (!accumulate) {
        (h.kind == CompressorKind::f16 ? cpu::f16_to_f32 : cpu::bf16_to_f32)(bits, o, h.n);
      } else {
        for (int64_t i = 0; i < h.n; ++i)
          o[i] +=
              h.kind == CompressorKind::f16 ? f16_bits_to_f32(bits[i]) : bf16_bits_to_f32(bits[i]);
      }
      return;
    }
    case CompressorKind::minmax:
      return decode_minmax(body, h.n, h.bits, h.chunk, o, accumulate, ctx, "minmax");
    case CompressorKind::sign:
      return decode_sign(body, h.n, h.chunk, o, accumulate);
    case CompressorKind::topk: {
      std::vector<uint32_t> idx(static_cast<size_t>(h.k));
      std::vector<float> vals(static_cast<size_t>(h.k));
      copy_bytes(idx.data(), body, idx.size() * 4);
      copy_bytes(vals.data(), body + idx.size() * 4, vals.size() * 4);
      check_indices(idx.data(), h.k, h.n, "topk");
      check_values(vals.data(), h.k, "topk");
      return scatter(idx.data(), vals.data(), h.k, o, h.n, accumulate);
    }
    case CompressorKind::randomk: {
      std::vector<float> vals(static_cast<size_t>(h.k));
      copy_bytes(vals.data(), body, vals.size() * 4);
      check_values(vals.data(), h.k, "randomk");
      const std::vector<uint32_t> idx =
          random_indices(h.n, h.k, h.random_mode, h.chunk, h.seed, h.step);
      return scatter(idx.data(), vals.data(), h.k, o, h.n, accumulate);
    }
    case CompressorKind::cocktail: {
      std::vector<float> vals(static_cast<size_t>(h.k));
      if (h.implicit_stride != 0) {
        decode_minmax(body, h.k, h.bits, h.chunk, vals.data(), false, ctx, "cocktail");
        if (!accumulate) std::fill(o, o + h.n, 0.0f);
        for_random_indices(
            h.n, h.k, h.random_mode, h.implicit_stride, h.seed, h.step,
            [&](int64_t j, int64_t i) { o[i] = accumulate ? o[i] + vals[j] : vals[j]; });
        return;
      }
      std::vector<uint32_t> idx(static_cast<size_t>(h.k));
      copy_bytes(idx.data(), body, idx.size() * 4);
      check_indices(idx.data(), h.k, h.n, "cocktail");
      decode_minmax(body + idx.size() * 4, h.k, h.bits, h.chunk, vals.data(), false, ctx,
                    "cocktail");
      return scatter(idx.data(), vals.data(), h.k, o, h.n, accumulate);
    }
  }
}

}  // namespace

int64_t kept_elements(int64_t n, const CompressorConfig& c) {
  switch (c.kind) {
    case CompressorKind::topk:
      return topk_kept(n, c);
    case CompressorKind::randomk:
      return random_count(n, c);
    case CompressorKind::cocktail:
      return cocktail_kept(n, c);
    default:
      return 0;
  }
}

size_t encoded_size(int64_t n, const CompressorConfig& c) {
  c.validate();
  RELAXCC_ENFORCE(n >= 0 && n <= int64_t{UINT32_MAX}, InvalidArgument,
                  "compressors take at most 2^32-1 elements, got ", n);
  return kHeader + body_size(n, c);
}

double compression_ratio(int64_t n, const CompressorConfig& c) {
  return static_cast<double>(n) * 4.0 / static_cast<double>(encoded_size(n, c));
}

CompressorConfig config_of(const PayloadHeader& h) {
  CompressorConfig c;
  c.kind = h.kind;
  c.bits = h.bits ? h.bits : 8;
  c.chunk = h.chunk ? h.chunk : 2048;
  c.rounding = h.rounding;
  c.random_mode = h.random_mode;
  c.seed = h.seed;
  c.step = h.step;
  c.keep = h.k;  // topk, stratified randomk: the same count
  if (h.kind == CompressorKind::randomk && h.random_mode == RandomKMode::rolling) {
    c.ratio = 1.0 / static_cast<double>(h.chunk);  // rounds back to the same stride
    c.keep = 0;
  }
  if (h.kind == CompressorKind::cocktail) {
    // (A stratified selection of k = 0 is only that of n = 0.)
    if (h.implicit_stride != 0 && (h.k > 0 || h.random_mode == RandomKMode::rolling)) {
      // The whole random selection, as sent: the same stride, or (stratified)
      // a ratio whose count is exactly k, so a re-encode selects the same
      // elements and sends no index either.
      c.ratio = h.random_mode == RandomKMode::rolling
                    ? 1.0 / static_cast<double>(h.implicit_stride)
                    : (static_cast<double>(h.k) - 0.5) / static_cast<double>(h.n);
      c.topk_ratio = 1.0;
    } else {
      // The first-stage ratio does not travel with the indices: a re-encode
      // keeps the count but draws its selection from ratio 1 (every element
      // is a candidate).
      c.ratio = 1.0;
    }
  }
  return c;
}

PayloadHeader read_header(std::span<const std::byte> payload) {
  RELAXCC_ENFORCE_GE(payload.size(), kHeader, CorruptPayload, "payload shorter than its header");
  PayloadHeader h;
  std::memcpy(&h, payload.data(), kHeader);
  validate_header(h, payload.size());
  return h;
}

void validate_header(const PayloadHeader& h, size_t payload_bytes) {
  RELAXCC_ENFORCE_EQ(h.magic, kPayloadMagic, CorruptPayload, "payload magic");
  RELAXCC_ENFORCE_EQ(h.version, kPayloadVersion, CorruptPayload, "payload version");
  const int kind = static_cast<int>(h.kind);
  RELAXCC_ENFORCE(kind >= 1 && kind <= 7, CorruptPayload, "payload: unknown compressor kind ",
                  kind);
  RELAXCC_ENFORCE(h.n >= 0 && h.n <= int64_t{UINT32_MAX}, CorruptPayload, "payload: element count ",
                  h.n);
  RELAXCC_ENFORCE(static_cast<int>(h.rounding) <= 1 && static_cast<int>(h.random_mode) <= 1 &&
                      (h.implicit_stride == 0 || h.kind == CompressorKind::cocktail),
                  CorruptPayload, "payload: bad flags");
  const bool quantizes = h.kind == CompressorKind::minmax || h.kind == CompressorKind::cocktail;
  RELAXCC_ENFORCE(!quantizes || h.bits == 8 || h.bits == 4 || h.bits == 2 || h.bits == 1,
                  CorruptPayload, "payload: ", int(h.bits), " bits per element");
  const bool chunked = quantizes || h.kind == CompressorKind::sign;
  RELAXCC_ENFORCE(!chunked || (h.chunk >= 1 && h.chunk <= (1u << 30)), CorruptPayload,
                  "payload: chunk ", h.chunk);
  CompressorConfig c = config_of(h);
  // The kept count cannot be recomputed for topk and cocktail (their ratios
  // do not travel): bound it by n; randomk recomputes it from seed and step.
  switch (h.kind) {
    case CompressorKind::topk:
      RELAXCC_ENFORCE(h.k >= 0 && h.k <= h.n, CorruptPayload, "topk payload: k ", h.k, " for ", h.n,
                      " elements");
      break;
    case CompressorKind::cocktail:
      RELAXCC_ENFORCE(h.k >= 0 && h.k <= h.n, CorruptPayload, "cocktail payload: k ", h.k, " for ",
                      h.n, " elements");
      if (h.implicit_stride != 0 && h.random_mode == RandomKMode::rolling)
        RELAXCC_ENFORCE_EQ(h.k, rolling_count(h.n, h.implicit_stride, h.step), CorruptPayload,
                           "cocktail payload: kept elements for the implicit rolling stride ",
                           h.implicit_stride, " at step ", h.step);
      else if (h.implicit_stride != 0)
        RELAXCC_ENFORCE(h.implicit_stride == 1 && (h.k > 0 || h.n == 0), CorruptPayload,
                        "stratified cocktail payload: implicit_stride ", h.implicit_stride,
                        " (expected 0 or 1), k ", h.k);
      break;
    case CompressorKind::randomk:
      RELAXCC_ENFORCE(h.k >= 0 && h.k <= h.n, CorruptPayload, "randomk payload: k ", h.k, " for ",
                      h.n, " elements");
      if (h.random_mode == RandomKMode::rolling) {
        RELAXCC_ENFORCE(h.chunk >= 1 && h.chunk <= (1u << 30), CorruptPayload,
                        "randomk payload: rolling stride ", h.chunk, " (expected [1, 2^30])");
        RELAXCC_ENFORCE_EQ(h.k, rolling_count(h.n, h.chunk, h.step), CorruptPayload,
                           "randomk payload: kept elements for stride ", h.chunk, " at step ",
                           h.step);
      } else {
        RELAXCC_ENFORCE(h.chunk == 0 && (h.k > 0 || h.n == 0), CorruptPayload,
                        "stratified randomk payload: stride ", h.chunk, ", k ", h.k);
      }
      break;
    default:
      RELAXCC_ENFORCE_EQ(h.k, int64_t{0}, CorruptPayload, "dense payload: k");
  }
  size_t expect = kHeader;
  switch (h.kind) {
    case CompressorKind::f16:
    case CompressorKind::bf16:
      expect += static_cast<size_t>(h.n) * 2;
      break;
    case CompressorKind::minmax:
      expect += minmax_body(h.n, h.bits, c.chunk);
      break;
    case CompressorKind::sign:
      expect += sign_body(h.n, c.chunk);
      break;
    case CompressorKind::topk:
      expect += static_cast<size_t>(h.k) * 8;
      break;
    case CompressorKind::randomk:
      expect += static_cast<size_t>(h.k) * 4;
      break;
    case CompressorKind::cocktail:
      expect += cocktail_body(h.k, h.implicit_stride != 0, h.bits, c.chunk);
      break;
  }
  RELAXCC_ENFORCE_EQ(payload_bytes, expect, CorruptPayload, compressor_name(h.kind), " payload of ",
                     h.n, " elements: size");
}

size_t encode(const TensorView& in, std::span<std::byte> out, const CompressorConfig& c,
              const ExecContext& ctx) {
  check_f32(in, "encode input");
  const size_t bytes = encoded_size(in.numel, c);
  RELAXCC_ENFORCE_GE(out.size(), bytes, InvalidArgument, compressor_name(c.kind),
                     " encode: output buffer bytes");
  if (ctx.device.is_cuda())
    return cuda::encode(in, out, c, header_for(in.numel, c), ctx.stream, ctx.rng.seed,
                        ctx.rng.offset);
  const PayloadHeader h = header_for(in.numel, c);
  std::memcpy(out.data(), &h, kHeader);
  std::byte* body = out.data() + kHeader;
  const auto* x = in.as<const float>();
  const int64_t n = in.numel;
  switch (c.kind) {
    case CompressorKind::f16:
    case CompressorKind::bf16: {
      auto* bits = reinterpret_cast<uint16_t*>(body);
      // One pass converts and checks; only a failure looks for the element.
      if ((c.kind == CompressorKind::f16 ? cpu::f32_to_f16_finite : cpu::f32_to_bf16_finite)(
              x, bits, n))
        break;
      require_finite(x, n, compressor_name(c.kind), 0, ctx);
      // A finite value that rounds to Inf would decode as corrupt: refuse it here.
      const int64_t bad = first_non_finite_half(bits, n, c.kind);
      if (bad >= 0)
        RELAXCC_THROW(
            InvalidArgument, compressor_name(c.kind), ": element ", bad, " is ", x[bad],
            ", which overflows ", compressor_name(c.kind), " (largest finite ",
            c.kind == CompressorKind::f16 ? f16_bits_to_f32(0x7bff) : bf16_bits_to_f32(0x7f7f),
            "); scale it down first (check for overflow first)");
      break;
    }
    case CompressorKind::minmax:
      encode_minmax(x, n, c, ctx, 0, body);
      break;
    case CompressorKind::sign:
      encode_sign(x, n, c.chunk, body);  // checks finiteness on the way
      break;
    case CompressorKind::topk: {
      auto* indices = reinterpret_cast<uint32_t*>(body);
      cpu::topk_strided(x, 0, 1, n, h.k, c.approximate, ctx, "topk", indices,
                        reinterpret_cast<float*>(indices + h.k));
      break;
    }
    case CompressorKind::randomk: {
      const std::vector<uint32_t> idx = random_indices(n, c);
      for (size_t j = 0; j < idx.size(); ++j) {
        RELAXCC_ENFORCE(std::isfinite(x[idx[j]]), InvalidArgument, "randomk: element ", idx[j],
                        " is not finite");
        std::memcpy(body + j * 4, x + idx[j], 4);
      }
      break;
    }
    case CompressorKind::cocktail: {
      std::vector<float> values(static_cast<size_t>(h.k));
      if (h.implicit_stride != 0) {
        // Top-k keeps the whole selection: its values, in order, no index.
        for_random_indices(n, h.k, c.random_mode, h.implicit_stride, c.seed, c.step,
                           [&](int64_t j, int64_t i) { values[j] = x[i]; });
        const int64_t bad = cpu::first_non_finite(values.data(), h.k, ctx);
        if (bad >= 0) {
          int64_t at = 0;
          for_random_indices(n, h.k, c.random_mode, h.implicit_stride, c.seed, c.step,
                             [&](int64_t j, int64_t i) { at = j == bad ? i : at; });
          RELAXCC_THROW(InvalidArgument, "cocktail: element ", at, " is ", values[bad],
                        "; compressors take finite values (check for overflow first)");
        }
        encode_minmax(values.data(), h.k, c, ctx, 0, body);
        break;
      }
      // Top-k among the random selection: a rolling one is read in place
      // (one strided pass, nothing gathered); a stratified one is gathered.
      auto* indices = reinterpret_cast<uint32_t*>(body);
      if (c.random_mode == RandomKMode::rolling) {
        const int64_t stride = rolling_stride(c.ratio);
        cpu::topk_strided(x, static_cast<int64_t>(c.step % static_cast<uint64_t>(stride)), stride,
                          random_count(n, c), h.k, c.approximate, ctx, "cocktail", indices,
                          values.data());
      } else {
        const std::vector<uint32_t> r = random_indices(n, c);
        std::vector<float> picked(r.size());
        for (size_t j = 0; j < r.size(); ++j) picked[j] = x[r[j]];
        require_finite(picked.data(), static_cast<int64_t>(picked.size()), "cocktail");
        cpu::topk_strided(picked.data(), 0, 1, static_cast<int64_t>(picked.size()), h.k,
                          c.approximate, ctx, "cocktail", indices, values.data());
        for (int64_t j = 0; j < h.k; ++j) indices[j] = r[indices[j]];
      }
      encode_minmax(values.data(), h.k, c, ctx, 0, body + h.k * 4);
      break;
    }
  }
  return bytes;
}

void decode(std::span<const std::byte> payload, const TensorView& out, const ExecContext& ctx) {
  decode_impl(payload, out, false, ctx);
}

void decode_accumulate(std::span<const std::byte> payload, const TensorView& acc,
                       const ExecContext& ctx) {
  decode_impl(payload, acc, true, ctx);
}

size_t requantize_sum(std::span<const std::byte> payload_in, const TensorView& local,
                      const TensorView& acc, std::span<std::byte> payload_out,
                      const ExecContext& ctx) {
  RELAXCC_ENFORCE(ctx.device.is_host(), Unsupported, "requantize_sum on ", ctx.device,
                  ": host payloads only");
  const PayloadHeader h = read_header(payload_in);
  check_f32(local, "requantize_sum local");
  RELAXCC_ENFORCE_EQ(h.n, local.numel, CorruptPayload, compressor_name(h.kind),
                     " payload: element count vs requantize_sum's local tensor");
  decode(payload_in, acc, ctx);
  auto* a = acc.as<float>();
  const auto* l = local.as<const float>();
  for (int64_t i = 0; i < h.n; ++i) a[i] += l[i];
  return encode(acc, payload_out, config_of(h), ctx);
}

}  // namespace relaxcc::kernels
