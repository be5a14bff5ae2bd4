// libFuzzer target for the chunk-wise top-k decoder (relaxcc/kernels/
// chunk_topk.h): the input is a payload whose magic and version are forced
// to chunk_topk's, every other header field and body byte comes from the
// fuzzer. The decoder contract is asserted, and any breach traps:
//   - decode either throws CorruptPayload (no other exception) or writes
//     only finite values;
//   - decoding with accumulate into zeros gives exactly what decode gave;
//   - re-encoding the decoded tensor with the payload's configuration
//     decodes without error to finite values.
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "fuzz_harness.h"
#include "relaxcc/errors.h"
#include "relaxcc/kernels/chunk_topk.h"

using namespace relaxcc;

constexpr const char* kTarget = "chunk_topk_fuzzer";

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::byte> payload = fuzz::copy_input(data, size);
  if (size < sizeof(kernels::ChunkTopkHeader)) return 0;
  kernels::ChunkTopkHeader h;
  std::memcpy(&h, payload.data(), sizeof h);
  h.magic = kernels::kChunkTopkMagic;
  h.version = kernels::kChunkTopkVersion;
  std::memcpy(payload.data(), &h, sizeof h);
  if (h.n < 0 || h.n > (int64_t{1} << 22)) return 0;  // keep outputs small
  const int64_t n = h.n;
  const ExecContext host = ExecContext::host();
  std::vector<float> out(static_cast<size_t>(n) + 1, 0.0f);
  try {
    kernels::chunk_topk_decode(payload, TensorView::host(out.data(), n), false, host);
  } catch (const CorruptPayload&) {
    return 0;
  }
  fuzz::require_finite(kTarget, out, n, "decode wrote a non-finite value");
  std::vector<float> acc(static_cast<size_t>(n) + 1, 0.0f);
  kernels::chunk_topk_decode(payload, TensorView::host(acc.data(), n), true, host);
  for (int64_t i = 0; i < n; ++i)
    if (!(acc[i] == out[i]))
      fuzz::fail(kTarget, "accumulate into zeros differs from decode", i, acc[i]);
  kernels::ChunkTopkConfig c;
  c.chunk = h.chunk;
  c.ratio = static_cast<double>(h.per_chunk) / h.chunk;
  c.bits = h.bits;
  c.group = h.group;
  std::vector<std::byte> again(kernels::chunk_topk_encoded_size(n, c));
  size_t bytes = 0;
  try {
    bytes = kernels::chunk_topk_encode(TensorView::host(out.data(), n), again, c, host);
  } catch (const InvalidArgument&) {
    return 0;  // a group's range wider than f32 (a documented encode refusal)
  }
  std::vector<float> round_trip(static_cast<size_t>(n) + 1, 0.0f);
  kernels::chunk_topk_decode(std::span<const std::byte>(again.data(), bytes),
                             TensorView::host(round_trip.data(), n), false, host);
  fuzz::require_finite(kTarget, round_trip, n,
                       "decode of a re-encoded payload wrote a non-finite value");
  return 0;
}
