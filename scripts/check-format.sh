#!/usr/bin/env bash
# Fails when a tracked C++ or CUDA source differs from what clang-format-14
# makes of it with the root .clang-format (column limit 100 included).
# Fix with: clang-format-14 -i $(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
clang-format-14 --dry-run --Werror "${files[@]}"
echo "check-format: ${#files[@]} files formatted"
