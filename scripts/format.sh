#!/usr/bin/env bash
# Formats the project's C and C++ sources with clang-format as .clang-format says, or with --check changes nothing
# and fails naming every file that is not formatted so (scripts/test.sh's phase "format", docs/testing.md).
# Usage: scripts/format.sh [--check]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format: clang-format is not installed (scripts/setup.sh installs it)" >&2; exit 2; }
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cpp' '*.hpp')
if [ "${1:-}" != --check ]; then
  clang-format -i "${files[@]}"
  echo "format: ${#files[@]} files formatted ($(clang-format --version))"
  exit 0
fi
unformatted=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || unformatted+=("$f")
done
if [ ${#unformatted[@]} -gt 0 ]; then
  echo "format: ${#unformatted[@]} of ${#files[@]} files are not formatted as .clang-format says (scripts/format.sh fixes them):"
  printf '  %s\n' "${unformatted[@]}"
  clang-format --dry-run "${unformatted[0]}" 2>&1 | head -20
  exit 1
fi
echo "format: all ${#files[@]} C and C++ files are formatted ($(clang-format --version))"
