// libFuzzer target for one decoder: the input is a payload whose header kind
// is forced to RELAXCC_FUZZ_KIND, so each target explores its own decoder.
// Every other header field and every body byte comes from the fuzzer.
//
// The decoder contract (relaxcc/kernels/compressor.h) is asserted, and any
// breach traps, which libFuzzer reports as a crash:
//   - decode either throws CorruptPayload (no other exception) or writes
//     only finite values;
//   - decode_accumulate into zeros gives exactly what decode gave;
//   - requantize_sum re-encodes (encode may refuse the sum with
//     InvalidArgument, e.g. a minmax chunk wider than f32), and what encode
//     writes decodes without error to finite values.
// AddressSanitizer and UBSan catch any out-of-bounds access or undefined
// behaviour on the way.
#include <cstdint>
#include <span>
#include <vector>

#include "fuzz_harness.h"
#include "relaxcc/errors.h"
#include "relaxcc/kernels/compressor.h"

using namespace relaxcc;

constexpr const char* kTarget = "decode_fuzzer";

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::byte> payload = fuzz::copy_input(data, size);
  if (size > 6) payload[6] = static_cast<std::byte>(RELAXCC_FUZZ_KIND);
  kernels::PayloadHeader h;
  try {
    h = kernels::read_header(payload);
  } catch (const CorruptPayload&) {
    return 0;
  }
  if (h.n > (int64_t{1} << 22)) return 0;  // keep outputs small; sizes are checked above
  const int64_t n = h.n;
  std::vector<float> out(static_cast<size_t>(n) + 1, 0.0f);
  try {
    kernels::decode(payload, TensorView(out.data(), n, DType::f32), ExecContext::host());
  } catch (const CorruptPayload&) {
    return 0;
  }
  fuzz::require_finite(kTarget, out, n, "decode wrote a non-finite value");

  std::vector<float> acc(static_cast<size_t>(n) + 1, 0.0f);
  kernels::decode_accumulate(payload, TensorView(acc.data(), n, DType::f32), ExecContext::host());
  for (int64_t i = 0; i < n; ++i)
    if (!(acc[i] == out[i]))
      fuzz::fail(kTarget, "decode_accumulate into zeros differs from decode", i, acc[i]);

  std::vector<float> local(static_cast<size_t>(n) + 1, 1.0f), sum(static_cast<size_t>(n) + 1);
  std::vector<std::byte> again(kernels::encoded_size(n, kernels::config_of(h)));
  size_t bytes = 0;
  try {
    bytes =
        kernels::requantize_sum(payload, TensorView(local.data(), n, DType::f32),
                                TensorView(sum.data(), n, DType::f32), again, ExecContext::host());
  } catch (const InvalidArgument&) {
    return 0;  // the sum is not encodable by this kind (documented encode refusals)
  }
  std::vector<float> round_trip(static_cast<size_t>(n) + 1, 0.0f);
  kernels::decode(std::span<const std::byte>(again.data(), bytes),
                  TensorView(round_trip.data(), n, DType::f32), ExecContext::host());
  fuzz::require_finite(kTarget, round_trip, n, "decode of an encoded sum wrote a non-finite value");
  return 0;
}
