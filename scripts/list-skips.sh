#!/usr/bin/env bash
# Prints the GoogleTest cases that CTest's last run skipped, grouped by the
# reason each printed (a GPU test without a device, say), so that skips are
# visible in the suite's output and not only in its log. Never fails.
set -uo pipefail
log=${1:-build/ci/Testing/Temporary/LastTest.log}
[ -f "$log" ] || { echo "list-skips: no CTest log at $log"; exit 0; }
sed 's/\x1b\[[0-9;]*m//g' "$log" | awk '
  / Skipped$/ { want = 1; next }
  want { reason = $0; want = 0; next }
  /^\[  SKIPPED \] [^ ]+ \(/ { n[reason]++; total++; reason = "(no reason printed)" }
  END {
    printf "list-skips: %d skipped test cases (summed over rank counts and ranks)\n", total
    for (r in n) printf "  %5d  %s\n", n[r], r | "sort -rn"
  }
' reason="(no reason printed)"
