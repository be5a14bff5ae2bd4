// libFuzzer target for one decoder: the input is a payload whose header kind
// is forced to RELAXCC_FUZZ_KIND, so each target explores its own decoder.
// Every other header field and every body byte comes from the fuzzer. The
// decoder must either succeed or throw relaxcc::Error; AddressSanitizer and
// UBSan catch any out-of-bounds access or undefined behaviour.
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "relaxcc/errors.h"
#include "relaxcc/kernels/compressor.h"

using namespace relaxcc;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::byte> payload(size);
  if (size > 0) std::memcpy(payload.data(), data, size);
  if (size > 6) payload[6] = static_cast<std::byte>(RELAXCC_FUZZ_KIND);
  kernels::PayloadHeader h;
  try {
    h = kernels::read_header(payload);
  } catch (const Error&) {
    return 0;
  }
  if (h.n > (int64_t{1} << 22)) return 0;  // keep outputs small; sizes are checked above
  std::vector<float> out(static_cast<size_t>(h.n) + 1, 0.0f);
  const TensorView view(out.data(), h.n, DType::f32);
  try {
    kernels::decode(payload, view, ExecContext::host());
    kernels::decode_accumulate(payload, view, ExecContext::host());
    std::vector<float> local(static_cast<size_t>(h.n) + 1, 1.0f), acc(static_cast<size_t>(h.n) + 1);
    std::vector<std::byte> again(kernels::encoded_size(h.n, kernels::config_of(h)));
    kernels::requantize_sum(payload, TensorView(local.data(), h.n, DType::f32), TensorView(acc.data(), h.n, DType::f32),
                            again, ExecContext::host());
  } catch (const Error&) {
  }
  return 0;
}
