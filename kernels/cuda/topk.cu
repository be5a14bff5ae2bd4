// Exact top-k selection by magnitude on a CUDA device: the selection of
// kernels/cpu/topk.h (every element whose |x| is above the k-th largest
// magnitude, then the lowest-index elements equal to it until k are kept,
// in ascending index order), bit for bit, with no host copy of the data.
//
// A radix select over the magnitude bits (the float's bits with the sign
// cleared, ordered like |x| for finite x): four passes of 8 bits, from the
// most significant, each a histogram of the digit among the elements that
// match the digits chosen so far, and a one-thread step that picks the bin
// holding the k-th largest. What the passes leave is that magnitude's bits
// (kth) and how many of the elements equal to it are kept (ties). Then a
// compaction: element i is kept when its magnitude is above kth, or equal
// to it with fewer than `ties` equal ones before it, and goes to position
// (elements above kth before i) + min(elements equal to kth before i,
// ties): per-tile counts, a scan of the tiles, and a scan within each tile.
// Everything is enqueued on the stream; nothing is read back.
#include <cuda_runtime.h>

#include <algorithm>
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "relaxcc/errors.h"

namespace relaxcc::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kItems = 16;                    // elements per thread in the compaction
constexpr int64_t kTile = kThreads * kItems;  // elements per compaction block
constexpr int kScanThreads = 1024;
constexpr int kMaxHistogramBlocks = 1024;

// The radix select's progress: the digits chosen so far (prefix, under
// mask), and how many of the largest elements matching them are still to
// be taken.
struct RadixState {
  uint32_t prefix;
  uint32_t mask;
  long long remaining;
};

__device__ uint32_t magnitude(float v) {
  return __float_as_uint(v) & 0x7fffffffu;
}

__global__ void init_kernel(RadixState* st, unsigned long long* hist, long long k) {
  st->prefix = 0;
  st->mask = 0;
  st->remaining = k;
  for (int b = 0; b < 256; ++b) hist[b] = 0;
}

// hist[digit] += elements matching the state's prefix, by their digit at `shift`.
__global__ void histogram_kernel(const float* x, int64_t n, int shift, const RadixState* st,
                                 unsigned long long* hist) {
  __shared__ unsigned int local[256];
  for (int b = threadIdx.x; b < 256; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const uint32_t prefix = st->prefix, mask = st->mask;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const uint32_t m = magnitude(x[i]);
    if ((m & mask) == prefix) atomicAdd(&local[(m >> shift) & 0xffu], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < 256; b += blockDim.x)
    if (local[b] != 0) atomicAdd(&hist[b], static_cast<unsigned long long>(local[b]));
}

// The bin, from the largest digit down, that holds the remaining-th largest
// element; the state takes its digit, and the histogram is cleared for the
// next pass.
__global__ void choose_digit_kernel(unsigned long long* hist, int shift, RadixState* st) {
  long long remaining = st->remaining;
  int b = 255;
  for (; b > 0; --b) {
    const auto count = static_cast<long long>(hist[b]);
    if (count >= remaining) break;
    remaining -= count;
  }
  st->prefix |= static_cast<uint32_t>(b) << shift;
  st->mask |= 0xffu << shift;
  st->remaining = remaining;
  for (int i = 0; i < 256; ++i) hist[i] = 0;
}

// Of this thread's kItems elements from `first` (those below n), how many
// have a magnitude above kth and how many equal to it. count_kernel and
// compact_kernel both count with it, so that the tile totals and the
// positions within a tile agree.
__device__ void count_items(const float* x, int64_t n, int64_t first, uint32_t kth,
                            unsigned int& above, unsigned int& equal) {
  above = 0;
  equal = 0;
  for (int j = 0; j < kItems; ++j) {
    const int64_t i = first + j;
    if (i >= n) break;
    const uint32_t m = magnitude(x[i]);
    above += m > kth;
    equal += m == kth;
  }
}

// Per tile: the elements above kth and those equal to it.
__global__ void count_kernel(const float* x, int64_t n, const RadixState* st,
                             unsigned int* tile_above, unsigned int* tile_equal) {
  using Reduce = cub::BlockScan<unsigned int, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const uint32_t kth = st->prefix;
  const int64_t first = blockIdx.x * kTile + static_cast<int64_t>(threadIdx.x) * kItems;
  unsigned int above, equal;
  count_items(x, n, first, kth, above, equal);
  unsigned int above_total = 0, equal_total = 0, unused = 0;
  Reduce(temp).ExclusiveSum(above, unused, above_total);
  __syncthreads();
  Reduce(temp).ExclusiveSum(equal, unused, equal_total);
  if (threadIdx.x == 0) {
    tile_above[blockIdx.x] = above_total;
    tile_equal[blockIdx.x] = equal_total;
  }
}

// One block: the exclusive prefix sums of both tile counts, in place of
// the 64-bit offsets.
__global__ void scan_tiles_kernel(const unsigned int* tile_above, const unsigned int* tile_equal,
                                  int64_t tiles, long long* above_before, long long* equal_before) {
  using Scan = cub::BlockScan<long long, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  const int64_t per = (tiles + kScanThreads - 1) / kScanThreads;
  const int64_t first = threadIdx.x * per, last = min(tiles, first + per);
  long long above = 0, equal = 0;
  for (int64_t t = first; t < last; ++t) {
    above += tile_above[t];
    equal += tile_equal[t];
  }
  long long above_start = 0, equal_start = 0;
  Scan(temp).ExclusiveSum(above, above_start);
  __syncthreads();
  Scan(temp).ExclusiveSum(equal, equal_start);
  for (int64_t t = first; t < last; ++t) {
    above_before[t] = above_start;
    equal_before[t] = equal_start;
    above_start += tile_above[t];
    equal_start += tile_equal[t];
  }
}

// Writes every kept element's index and value at its position.
__global__ void compact_kernel(const float* x, int64_t n, const RadixState* st,
                               const long long* above_before, const long long* equal_before,
                               uint32_t* indices, float* values) {
  using Scan = cub::BlockScan<unsigned int, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  const uint32_t kth = st->prefix;
  const long long ties = st->remaining;
  const int64_t first = blockIdx.x * kTile + static_cast<int64_t>(threadIdx.x) * kItems;
  unsigned int above, equal;
  count_items(x, n, first, kth, above, equal);
  unsigned int above_start = 0, equal_start = 0;
  Scan(temp).ExclusiveSum(above, above_start);
  __syncthreads();
  Scan(temp).ExclusiveSum(equal, equal_start);
  long long a = above_before[blockIdx.x] + above_start;
  long long e = equal_before[blockIdx.x] + equal_start;
  for (int j = 0; j < kItems; ++j) {
    const int64_t i = first + j;
    if (i >= n) break;
    const float v = x[i];
    const uint32_t m = magnitude(v);
    if (m > kth || (m == kth && e < ties)) {
      const long long pos = a + min(e, ties);
      indices[pos] = static_cast<uint32_t>(i);
      values[pos] = v;
    }
    a += m > kth;
    e += m == kth;
  }
}

}  // namespace

void topk_select(const float* x, int64_t n, int64_t k, uint32_t* indices, float* values,
                 void* stream_ptr) {
  RELAXCC_ENFORCE(k >= 0 && k <= n && n <= (int64_t{1} << 32), InvalidArgument, "topk_select: k ",
                  k, " of ", n, " elements, expected 0 <= k <= n <= 2^32");
  if (k == 0) return;
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t tiles = (n + kTile - 1) / kTile;
  // Scratch: the state, the histogram, the tiles' counts and offsets.
  const size_t bytes =
      sizeof(RadixState) + 256 * sizeof(unsigned long long) +
      static_cast<size_t>(tiles) * (2 * sizeof(unsigned int) + 2 * sizeof(long long));
  void* scratch = nullptr;
  check(cudaMallocAsync(&scratch, bytes, stream), "cudaMallocAsync");
  auto* hist = static_cast<unsigned long long*>(scratch);
  auto* above_before = reinterpret_cast<long long*>(hist + 256);
  auto* equal_before = above_before + tiles;
  auto* st = reinterpret_cast<RadixState*>(equal_before + tiles);
  auto* tile_above = reinterpret_cast<unsigned int*>(st + 1);
  auto* tile_equal = tile_above + tiles;
  const int hist_blocks =
      static_cast<int>(std::min<int64_t>(kMaxHistogramBlocks, (n + kThreads - 1) / kThreads));
  init_kernel<<<1, 1, 0, stream>>>(st, hist, static_cast<long long>(k));
  for (int shift = 24; shift >= 0; shift -= 8) {
    histogram_kernel<<<hist_blocks, kThreads, 0, stream>>>(x, n, shift, st, hist);
    choose_digit_kernel<<<1, 1, 0, stream>>>(hist, shift, st);
  }
  count_kernel<<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(x, n, st, tile_above,
                                                                      tile_equal);
  scan_tiles_kernel<<<1, kScanThreads, 0, stream>>>(tile_above, tile_equal, tiles, above_before,
                                                    equal_before);
  compact_kernel<<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(
      x, n, st, above_before, equal_before, indices, values);
  const cudaError_t launched = cudaGetLastError();
  const cudaError_t freed = cudaFreeAsync(scratch, stream);
  check(launched, "topk selection kernel launch");
  check(freed, "cudaFreeAsync");
}

}  // namespace relaxcc::kernels::cuda
