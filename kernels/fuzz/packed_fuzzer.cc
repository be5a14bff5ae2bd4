// libFuzzer target for unpack_payload (relaxcc/kernels/payload_packing.h):
// the input is a packed frame, every byte from the fuzzer. The contract is
// asserted (a breach traps, which libFuzzer reports as a crash):
//   - unpacked_size and unpack_payload either throw CorruptPayload (no other
//     exception) or succeed;
//   - a frame that unpacks does so again to the same bytes (deterministic).
// AddressSanitizer and UBSan catch any access outside the spans.
#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

#include "fuzz_harness.h"
#include "relaxcc/errors.h"
#include "relaxcc/kernels/payload_packing.h"

using namespace relaxcc;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::byte> packed = fuzz::copy_input(data, size);
  size_t raw_bytes = 0;
  try {
    raw_bytes = kernels::unpacked_size(packed);
  } catch (const CorruptPayload&) {
    return 0;
  }
  if (raw_bytes > (size_t{1} << 24)) return 0;  // keep outputs small; the size was checked
  std::vector<std::byte> raw(raw_bytes), again(raw_bytes);
  try {
    kernels::unpack_payload(packed, raw);
  } catch (const CorruptPayload&) {
    return 0;
  }
  kernels::unpack_payload(packed, again);
  if (raw != again) {
    std::fprintf(stderr, "packed_fuzzer: a frame unpacked to different bytes twice\n");
    __builtin_trap();
  }
  return 0;
}
