#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: installs the packages,
# checks the formatting (.clang-format), configures and builds with the CI preset (-Werror on relaxcc's targets),
# runs every CTest entry (then lists the skipped test cases with their reasons), then the collectives,
# fault and reducer programs under ThreadSanitizer (the tsan preset), then the decoder fuzzers for a
# bounded time.
# Prints the time of each stage.
set -euo pipefail
cd "$(dirname "$0")/.."

stage() {
  local name=$1
  shift
  local t0=$SECONDS
  echo "=== stage ${name}"
  "$@"
  echo "=== stage ${name}: $((SECONDS - t0)) s"
}

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
stage install-deps bash scripts/install-deps.sh
stage format bash scripts/check-format.sh
stage configure cmake --preset ci
stage build cmake --build --preset ci
stage test ctest --preset ci -j "$(nproc)"
stage skips bash scripts/list-skips.sh build/ci/Testing/Temporary/LastTest.log
stage tsan-build bash -c 'cmake --preset tsan && cmake --build --preset tsan'
stage tsan-test ctest --preset tsan -j "$(nproc)"
stage fuzz bash scripts/run-fuzz.sh
