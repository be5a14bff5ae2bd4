#!/usr/bin/env bash
# Builds the decoder fuzzers (CMake preset "fuzz": clang-14, libFuzzer,
# AddressSanitizer, UBSan) and runs each one from its committed seed corpus
# for a bounded time: RELAXCC_FUZZ_SECONDS each (default 12: 9 targets and
# their build in about 2.5 minutes, so that .ci/run stays under 25). Fails on any crash, leak or sanitizer report.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${RELAXCC_FUZZ_SECONDS:-12}
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
for kind in f16 bf16 minmax sign topk randomk cocktail chunk_topk packed; do
  mkdir -p "$work/$kind"
  echo "=== fuzz_decode_${kind}: ${seconds} s"
  # New inputs go to the scratch directory; the committed corpus is read only.
  if ! build/fuzz/kernels/fuzz/fuzz_decode_${kind} -max_total_time="${seconds}" -rss_limit_mb=4096 \
       -print_final_stats=1 "$work/$kind" "kernels/fuzz/corpus/$kind" > "$work/$kind.log" 2>&1; then
    echo "=== fuzz_decode_${kind} FAILED"; tail -40 "$work/$kind.log"; status=1
  else
    grep -E "^Done|stat::number_of_executed_units" "$work/$kind.log" | head -2
  fi
done
exit $status
