#!/usr/bin/env bash
# Fails when a tracked C++ or CUDA source differs from what clang-format-14
# makes of it with the root .clang-format (column limit 100 included).
# Fix with: clang-format-14 -i $(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
clang-format-14 --dry-run --Werror "${files[@]}"
echo "check-format: ${#files[@]} files formatted"
# Includes are rooted at the project or at a target's include directory
# ("src/engine/engine.h", "relaxcc/work.h"), never relative to the including file.
if grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"\.\./' "${files[@]}"; then
  echo "check-format: the includes above climb out of their folder with ../" >&2
  exit 1
fi
