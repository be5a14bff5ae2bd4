// Compression kernels on CUDA devices: min-max quantize/dequantize with
// round-to-nearest or stochastic rounding, random-k gather, top-k
// (kernels/cuda/topk.cu), sparse scatter and the casts. Every arithmetic
// step uses the round-to-nearest intrinsics (__fsub_rn, __fmul_rn,
// __fadd_rn, __fdiv_rn) so that no fused multiply-add changes a result: payloads match the CPU
// kernels bit for bit. Payloads are laid out exactly as on the host (relaxcc/kernels/compressor.h).
#include <cuda_runtime.h>

#include <cstring>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "relaxcc/errors.h"
#include "relaxcc/half.h"
#include "relaxcc/kernels/philox.h"

namespace relaxcc::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr size_t kHeader = sizeof(PayloadHeader);

// Device-side error flag: 0 ok, else an error code with an index. Allocated
// and freed in the order of `stream`.
struct DeviceFlag {
  unsigned long long* ptr = nullptr;
  cudaStream_t stream_;
  explicit DeviceFlag(cudaStream_t stream) : stream_(stream) {
    check(cudaMallocAsync(reinterpret_cast<void**>(&ptr), sizeof(*ptr), stream), "cudaMallocAsync");
    const cudaError_t err = cudaMemsetAsync(ptr, 0, sizeof(*ptr), stream);
    if (err != cudaSuccess) cudaFreeAsync(ptr, stream);
    check(err, "cudaMemsetAsync");
  }
  // Synchronizes the stream and returns the flag.
  unsigned long long read(cudaStream_t stream) {
    unsigned long long v = 0;
    check(cudaMemcpyAsync(&v, ptr, sizeof(v), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return v;
  }
  ~DeviceFlag() { cudaFreeAsync(ptr, stream_); }
};

__device__ void raise_flag(unsigned long long* flag, unsigned long long code) {
  atomicCAS(flag, 0ull, code);
}

__device__ bool finite(float x) {
  return isfinite(x);
}

// Error codes of the device flag (code << 40 | element or chunk); report()
// turns them into the host's exceptions and messages.
enum FlagCode : unsigned long long {
  kNonFiniteInput = 1,   // InvalidArgument
  kBadChunk = 2,         // CorruptPayload: min or scale not finite
  kBadIndex = 3,         // CorruptPayload
  kBadValue = 4,         // CorruptPayload: a sparse value not finite
  kRangeOverflow = 5,    // InvalidArgument: a chunk's max - min overflows f32
  kHalfOverflow = 6,     // InvalidArgument: a finite value rounds to f16/bf16 Inf
  kDecodedOverflow = 7,  // CorruptPayload: a chunk decodes past the f32 range
  kBadHalf = 8,          // CorruptPayload: an f16/bf16 Inf or NaN bit pattern
};

// The scale field's factors (kernels/cpu/quantize.h, kMinmaxPrescale): |f|,
// and the multipliers before quantizing and after dequantizing.
constexpr float kPrescale = 0x1p100f;  // cpu::kMinmaxPrescale
constexpr float kPrescaleInverse = 0x1p-100f;
struct ScaleField {
  float scale, up, down;
};
__device__ ScaleField scale_field(float field) {
  if (signbit(field)) return {fabsf(field), kPrescale, kPrescaleInverse};
  return {field, 1.0f, 1.0f};
}

// minmax_decoded_max of kernels/cpu/quantize.h, with the dequantizer's
// operations: the largest value a chunk decodes to.
__device__ float decoded_max(float mn, float field, int bits) {
  const ScaleField f = scale_field(field);
  const float inv = f.scale > 0.0f ? __fdiv_rn(1.0f, f.scale) : 0.0f;
  return __fadd_rn(mn, __fmul_rn(__fmul_rn(static_cast<float>((1u << bits) - 1u), inv), f.down));
}

// An f16 or bf16 value is Inf or NaN when its exponent bits are all ones.
__device__ bool half_non_finite(uint16_t bits, int bf16) {
  const uint16_t mask = bf16 ? 0x7f80 : 0x7c00;
  return (bits & mask) == mask;
}

// ---- min-max ----------------------------------------------------------------

// One block per chunk: range, scale, codes. `index0` of chunk ch is ch * chunk.
__global__ void quantize_kernel(const float* x, int64_t n, int64_t chunk, int bits, int stochastic,
                                uint64_t seed, uint64_t offset, unsigned char* body,
                                unsigned long long* flag) {
  const int64_t ch = blockIdx.x;
  const int64_t first = ch * chunk;
  const int64_t len = min(chunk, n - first);
  const int64_t stride = 8 + (chunk * bits + 7) / 8;
  unsigned char* p = body + ch * stride;
  __shared__ float s_min[kThreads], s_max[kThreads];
  __shared__ int s_bad;
  if (threadIdx.x == 0) s_bad = 0;
  __syncthreads();
  float lo = x[first], hi = lo;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
    const float v = x[first + i];
    if (!finite(v)) s_bad = 1;
    lo = fminf(lo, v);
    hi = fmaxf(hi, v);
  }
  s_min[threadIdx.x] = lo;
  s_max[threadIdx.x] = hi;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      s_min[threadIdx.x] = fminf(s_min[threadIdx.x], s_min[threadIdx.x + w]);
      s_max[threadIdx.x] = fmaxf(s_max[threadIdx.x], s_max[threadIdx.x + w]);
    }
    __syncthreads();
  }
  if (s_bad) {
    if (threadIdx.x == 0)
      raise_flag(flag, kNonFiniteInput << 40 | static_cast<unsigned long long>(ch));
    return;
  }
  const float mn = s_min[0], mx = s_max[0];
  if (!finite(__fsub_rn(mx, mn))) {
    if (threadIdx.x == 0)
      raise_flag(flag, kRangeOverflow << 40 | static_cast<unsigned long long>(ch));
    return;
  }
  // cpu::minmax_scale: pre-scaled below a range of 1 / kPrescale, then |s|
  // raised by ulps until the chunk's decoded maximum is at most max.
  float field = 0.0f;
  if (mx > mn) {
    const float levels = static_cast<float>((1u << bits) - 1u);
    const float range = __fsub_rn(mx, mn);
    const bool prescaled = range < kPrescaleInverse;
    float s = prescaled ? __fdiv_rn(levels, __fmul_rn(range, kPrescale)) : __fdiv_rn(levels, range);
    while (!(decoded_max(mn, prescaled ? -s : s, bits) <= mx)) s = nextafterf(s, INFINITY);
    field = prescaled ? -s : s;
  }
  const ScaleField f = scale_field(field);
  if (threadIdx.x == 0) {
    memcpy(p, &mn, 4);
    memcpy(p + 4, &field, 4);
  }
  const uint32_t levels = (1u << bits) - 1u;
  const int per_byte = 8 / bits;
  const int64_t bytes = (len * bits + 7) / 8;
  for (int64_t b = threadIdx.x; b < bytes; b += blockDim.x) {
    unsigned int packed = 0;
    for (int j = 0; j < per_byte; ++j) {
      const int64_t i = b * per_byte + j;
      if (i >= len) break;
      const float v = __fmul_rn(__fmul_rn(__fsub_rn(x[first + i], mn), f.up), f.scale);
      float r;
      if (stochastic) {
        const float u = rounding_uniform(seed, offset, static_cast<uint64_t>(first + i));
        r = floorf(__fadd_rn(v, u));
      } else {
        r = rintf(v);
      }
      const uint32_t q = r <= 0.0f                         ? 0u
                         : r >= static_cast<float>(levels) ? levels
                                                           : static_cast<uint32_t>(r);
      packed |= q << (j * bits);
    }
    p[8 + b] = static_cast<unsigned char>(packed);
  }
}

// One thread per chunk: the decoder contract's checks of (min, scale), run
// before anything is written.
__global__ void check_minmax_kernel(const unsigned char* body, int64_t n, int64_t chunk, int bits,
                                    unsigned long long* flag) {
  const int64_t ch = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (ch >= (n + chunk - 1) / chunk) return;
  const unsigned char* p = body + ch * (8 + (chunk * bits + 7) / 8);
  float mn, scale;
  memcpy(&mn, p, 4);
  memcpy(&scale, p + 4, 4);
  if (!finite(mn) || !finite(scale))
    raise_flag(flag, kBadChunk << 40 | static_cast<unsigned long long>(ch));
  else if (!finite(decoded_max(mn, scale, bits)))
    raise_flag(flag, kDecodedOverflow << 40 | static_cast<unsigned long long>(ch));
}

__global__ void dequantize_kernel(const unsigned char* body, int64_t n, int64_t chunk, int bits,
                                  float* out, int accumulate, unsigned long long* flag) {
  const int64_t ch = blockIdx.x;
  const int64_t first = ch * chunk;
  const int64_t len = min(chunk, n - first);
  const unsigned char* p = body + ch * (8 + (chunk * bits + 7) / 8);
  float mn, scale;
  memcpy(&mn, p, 4);
  memcpy(&scale, p + 4, 4);
  if (!finite(mn) || !finite(scale) || !finite(decoded_max(mn, scale, bits))) {
    // check_minmax_kernel ran first and was reported; this is a second guard.
    if (threadIdx.x == 0) raise_flag(flag, kBadChunk << 40 | static_cast<unsigned long long>(ch));
    return;
  }
  // The same inverse and operations as decoded_max.
  const ScaleField f = scale_field(scale);
  const float inv = f.scale > 0.0f ? __fdiv_rn(1.0f, f.scale) : 0.0f;
  const int per_byte = 8 / bits;
  const uint32_t mask = (1u << bits) - 1u;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
    const uint32_t q = (p[8 + i / per_byte] >> ((i % per_byte) * bits)) & mask;
    const float v = __fadd_rn(mn, __fmul_rn(__fmul_rn(static_cast<float>(q), inv), f.down));
    out[first + i] = accumulate ? __fadd_rn(out[first + i], v) : v;
  }
}

// ---- sparse -----------------------------------------------------------------

// The selection's index j (philox.h: the same on the host).
__device__ int64_t random_index(int64_t n, int64_t k, int64_t j, int rolling, int64_t stride,
                                uint64_t seed, uint64_t step) {
  if (rolling) return static_cast<int64_t>(step % static_cast<uint64_t>(stride)) + j * stride;
  return static_cast<int64_t>(stratified_index(static_cast<uint64_t>(n), static_cast<uint64_t>(k),
                                               static_cast<uint64_t>(j), seed, step));
}

__global__ void random_gather_kernel(const float* x, int64_t n, int64_t k, int rolling,
                                     int64_t stride, uint64_t seed, uint64_t step, float* vals,
                                     unsigned long long* flag) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= k) return;
  const int64_t i = random_index(n, k, j, rolling, stride, seed, step);
  const float v = x[i];
  if (!finite(v)) raise_flag(flag, kNonFiniteInput << 40 | static_cast<unsigned long long>(i));
  vals[j] = v;
}

// Scatters k values; `idx` null means the randomk selection. Validates the
// indices (in range, strictly increasing) and the values (finite) first.
__global__ void check_sparse_kernel(const uint32_t* idx, const float* vals, int64_t k, int64_t n,
                                    unsigned long long* flag) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= k) return;
  if (idx != nullptr && (idx[j] >= n || (j > 0 && idx[j] <= idx[j - 1])))
    raise_flag(flag, kBadIndex << 40 | static_cast<unsigned long long>(j));
  if (!finite(vals[j])) raise_flag(flag, kBadValue << 40 | static_cast<unsigned long long>(j));
}

__global__ void scatter_kernel(const uint32_t* idx, const float* vals, int64_t k, int64_t n,
                               int rolling, int64_t stride, uint64_t seed, uint64_t step,
                               float* out, int accumulate) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= k) return;
  const int64_t i = idx != nullptr ? static_cast<int64_t>(idx[j])
                                   : random_index(n, k, j, rolling, stride, seed, step);
  out[i] = accumulate ? __fadd_rn(out[i], vals[j]) : vals[j];
}

// f16/bf16 payloads never hold Inf or NaN (encode refuses values that
// round to Inf): such a pattern is corrupt on decode, and an overflow on
// encode (a finite input, checked first by finite_kernel).
__global__ void check_half_kernel(const uint16_t* bits, int64_t n, int bf16,
                                  unsigned long long code, unsigned long long* flag) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n && half_non_finite(bits[i], bf16))
    raise_flag(flag, code << 40 | static_cast<unsigned long long>(i));
}

__global__ void half_kernel(const uint16_t* in, int64_t n, int bf16, float* out, int accumulate) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float v = bf16 ? bf16_bits_to_f32(in[i]) : f16_bits_to_f32(in[i]);
  out[i] = accumulate ? __fadd_rn(out[i], v) : v;
}

__global__ void finite_kernel(const float* x, int64_t n, unsigned long long* flag) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n && !finite(x[i]))
    raise_flag(flag, kNonFiniteInput << 40 | static_cast<unsigned long long>(i));
}

int blocks_for(int64_t n) {
  return static_cast<int>((n + kThreads - 1) / kThreads);
}

void report(unsigned long long code, const char* what) {
  if (code == 0) return;
  const unsigned long long kind = code >> 40, where = code & ((1ull << 40) - 1);
  switch (kind) {
    case kNonFiniteInput:
      RELAXCC_THROW(InvalidArgument, what, ": a non-finite input near element or chunk ", where,
                    "; compressors take finite values");
    case kBadChunk:
      RELAXCC_THROW(CorruptPayload, what, " payload: chunk ", where,
                    " has a non-finite min or scale (expected both finite)");
    case kBadIndex:
      RELAXCC_THROW(CorruptPayload, what, " payload: index at position ", where,
                    " is out of range or order");
    case kRangeOverflow:
      RELAXCC_THROW(InvalidArgument, what, " encode: chunk ", where,
                    " has a range max - min that overflows f32; compressors take chunks whose max "
                    "- min is finite");
    case kHalfOverflow:
      RELAXCC_THROW(InvalidArgument, what, ": element ", where, " overflows ", what,
                    "; scale it down first (check for overflow first)");
    case kDecodedOverflow:
      RELAXCC_THROW(CorruptPayload, what, " payload: chunk ", where,
                    " decodes up to min + (2^bits - 1) / |scale|, which overflows f32 (expected a "
                    "finite decoded range;"
                    " a scale this small is corrupt)");
    case kBadHalf:
      RELAXCC_THROW(
          CorruptPayload, what, " payload: element ", where,
          " is an Inf or NaN bit pattern (expected a finite value: encode never writes these)");
    default:
      RELAXCC_THROW(CorruptPayload, what, " payload: value at position ", where, " is not finite");
  }
}

}  // namespace

size_t encode(const TensorView& in, std::span<std::byte> payload, const CompressorConfig& c,
              const PayloadHeader& h, void* stream_ptr, uint64_t rng_seed, uint64_t rng_offset) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  const size_t bytes = encoded_size(in.numel, c);
  check(cudaMemcpyAsync(payload.data(), &h, kHeader, cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync");
  auto* body = reinterpret_cast<unsigned char*>(payload.data() + kHeader);
  const auto* x = static_cast<const float*>(in.data);
  const int64_t n = in.numel;
  DeviceFlag flag(stream);
  switch (c.kind) {
    case CompressorKind::f16:
    case CompressorKind::bf16:
      if (n > 0) {
        finite_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, flag.ptr);
        cast(in,
             TensorView(body, n, c.kind == CompressorKind::f16 ? DType::f16 : DType::bf16,
                        in.device),
             stream);
        check_half_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
            reinterpret_cast<const uint16_t*>(body), n, c.kind == CompressorKind::bf16,
            kHalfOverflow, flag.ptr);
      }
      break;
    case CompressorKind::minmax: {
      const int64_t chunks = (n + c.chunk - 1) / c.chunk;
      if (chunks > 0)
        quantize_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(
            x, n, c.chunk, c.bits, c.rounding == Rounding::stochastic, rng_seed, rng_offset, body,
            flag.ptr);
      break;
    }
    case CompressorKind::randomk:
      if (h.k > 0)
        random_gather_kernel<<<blocks_for(h.k), kThreads, 0, stream>>>(
            x, n, h.k, h.random_mode == RandomKMode::rolling, h.chunk ? h.chunk : 1, h.seed, h.step,
            reinterpret_cast<float*>(body), flag.ptr);
      break;
    case CompressorKind::topk:
      // Finite inputs only (the flag reports the first bad one), then the
      // selection on the device: indices, then values, as the host lays them out.
      if (h.k > 0) {
        finite_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x, n, flag.ptr);
        topk_select(x, n, h.k, reinterpret_cast<uint32_t*>(body),
                    reinterpret_cast<float*>(body + h.k * 4), stream);
      }
      break;
    default:
      RELAXCC_THROW(
          Unsupported, compressor_name(c.kind),
          " encode on a CUDA device: device kernels cover casts, minmax, randomk and topk");
  }
  check(cudaGetLastError(), "compression kernel launch");
  report(flag.read(stream), compressor_name(c.kind));
  return bytes;
}

void decode(std::span<const std::byte> payload, const TensorView& out, bool accumulate,
            void* stream_ptr) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  // The header is validated on the host against the payload's size.
  RELAXCC_ENFORCE_GE(payload.size(), kHeader, CorruptPayload, "payload shorter than its header");
  PayloadHeader h;
  check(cudaMemcpyAsync(&h, payload.data(), kHeader, cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  validate_header(h, payload.size());
  // The output is the caller's; a payload that disagrees with it is corrupt.
  RELAXCC_ENFORCE_EQ(h.n, out.numel, CorruptPayload, compressor_name(h.kind),
                     " payload: element count vs the output's");
  const auto* body = reinterpret_cast<const unsigned char*>(payload.data() + kHeader);
  auto* o = static_cast<float*>(out.data);
  const int64_t n = h.n;
  DeviceFlag flag(stream);
  const int acc = accumulate ? 1 : 0;
  // Sparse kinds zero the output (unless accumulating) once the payload
  // has been validated: nothing is written for a corrupt payload.
  auto zero_output = [&] {
    if (!accumulate && n > 0)
      check(cudaMemsetAsync(o, 0, static_cast<size_t>(n) * 4, stream), "cudaMemsetAsync");
  };
  switch (h.kind) {
    case CompressorKind::f16:
    case CompressorKind::bf16:
      if (n > 0) {
        check_half_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
            reinterpret_cast<const uint16_t*>(body), n, h.kind == CompressorKind::bf16, kBadHalf,
            flag.ptr);
        report(flag.read(stream), compressor_name(h.kind));
        half_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
            reinterpret_cast<const uint16_t*>(body), n, h.kind == CompressorKind::bf16, o, acc);
      }
      break;
    case CompressorKind::minmax: {
      const int64_t chunks = (n + h.chunk - 1) / h.chunk;
      if (chunks > 0) {
        check_minmax_kernel<<<blocks_for(chunks), kThreads, 0, stream>>>(body, n, h.chunk, h.bits,
                                                                         flag.ptr);
        report(flag.read(stream), "minmax");
        dequantize_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(
            body, n, h.chunk, h.bits, o, acc, flag.ptr);
      }
      break;
    }
    case CompressorKind::topk:
    case CompressorKind::randomk: {
      if (h.k == 0) {
        zero_output();
        break;
      }
      const bool has_idx = h.kind == CompressorKind::topk;
      const auto* idx = has_idx ? reinterpret_cast<const uint32_t*>(body) : nullptr;
      const auto* vals = reinterpret_cast<const float*>(body + (has_idx ? h.k * 4 : 0));
      check_sparse_kernel<<<blocks_for(h.k), kThreads, 0, stream>>>(idx, vals, h.k, n, flag.ptr);
      report(flag.read(stream), compressor_name(h.kind));
      zero_output();
      scatter_kernel<<<blocks_for(h.k), kThreads, 0, stream>>>(
          idx, vals, h.k, n, h.random_mode == RandomKMode::rolling, h.chunk ? h.chunk : 1, h.seed,
          h.step, o, acc);
      break;
    }
    case CompressorKind::cocktail: {
      if (h.k == 0) {
        zero_output();
        break;
      }
      // Implicit indices: the random stage's selection (scatter_kernel
      // recomputes it).
      const bool implicit = h.implicit_stride != 0;
      const auto* idx = implicit ? nullptr : reinterpret_cast<const uint32_t*>(body);
      const unsigned char* values = body + (implicit ? 0 : h.k * 4);
      float* vals = nullptr;
      check(cudaMallocAsync(reinterpret_cast<void**>(&vals), static_cast<size_t>(h.k) * 4, stream),
            "cudaMallocAsync");
      const int64_t chunks = (h.k + h.chunk - 1) / h.chunk;
      check_minmax_kernel<<<blocks_for(chunks), kThreads, 0, stream>>>(values, h.k, h.chunk, h.bits,
                                                                       flag.ptr);
      dequantize_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(
          values, h.k, h.chunk, h.bits, vals, 0, flag.ptr);
      check_sparse_kernel<<<blocks_for(h.k), kThreads, 0, stream>>>(idx, vals, h.k, n, flag.ptr);
      const unsigned long long code = flag.read(stream);
      if (code == 0) {
        zero_output();
        scatter_kernel<<<blocks_for(h.k), kThreads, 0, stream>>>(
            idx, vals, h.k, n, h.random_mode == RandomKMode::rolling,
            implicit ? h.implicit_stride : 1, h.seed, h.step, o, acc);
      }
      cudaFreeAsync(vals, stream);
      report(code, "cocktail");
      break;
    }
    default:
      RELAXCC_THROW(Unsupported, "decode on a CUDA device: ", compressor_name(h.kind));
  }
  check(cudaGetLastError(), "decompression kernel launch");
  report(flag.read(stream), compressor_name(h.kind));
}

}  // namespace relaxcc::kernels::cuda
