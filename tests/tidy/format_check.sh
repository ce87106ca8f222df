#!/usr/bin/env bash
# Formatting: every C and C++ file git tracks is as .clang-format says (docs/testing.md).
# clang-format's output moves between major versions, so the check runs with the one Debian 12
# ships (14), which CI has; with another it says so and is skipped.
# Usage: format_check.sh SOURCE_DIR. Exit 77 (skipped) outside a git checkout, or with another
# clang-format.
set -euo pipefail
cd "$1"
want=14
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "not a git checkout: no list of the files to check (skipped)"
  exit 77
fi
if ! command -v clang-format >/dev/null; then
  echo "clang-format is not installed (Debian: clang-format; scripts/install-deps.sh installs it)"
  exit 1
fi
version=$(clang-format --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
if [[ "$version" != "$want" ]]; then
  echo "clang-format $version is not $want, whose output the tree is in (skipped)"
  exit 77
fi
mapfile -t files < <(git ls-files '*.c' '*.cc' '*.h')
if ! out=$(clang-format --dry-run --Werror "${files[@]}" 2>&1); then
  echo "these files are not formatted as .clang-format says; run clang-format -i on each"
  echo "(or git clang-format before a commit, for the lines it changes):"
  grep -o '^[^: ]*\.[ch]c\?:' <<<"$out" | sort -u | sed 's/:$//'
  echo "$out" | head -60
  exit 1
fi
echo "formatted: all ${#files[@]} C/C++ files"
