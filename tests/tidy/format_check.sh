#!/usr/bin/env bash
# Formatting: every line of C and C++ changed since the commit named in .ci/format-base is as
# .clang-format says (`git clang-format`, docs/testing.md). Lines older than that commit are
# left as they were written: formatting them all would touch 291 files at once.
# Usage: format_check.sh SOURCE_DIR. Exit 77 (skipped) outside a git checkout only.
set -euo pipefail
cd "$1"
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "not a git checkout: nothing to compare with (skipped)"
  exit 77
fi
base=$(cat .ci/format-base)
if ! git cat-file -e "$base^{commit}" 2>/dev/null; then
  echo "the base commit $base is not in this clone (a shallow clone? fetch its history)"
  exit 1
fi
if ! command -v git-clang-format >/dev/null; then
  echo "git clang-format is not installed (Debian: clang-format; scripts/install-deps.sh installs it)"
  exit 1
fi
out=$(git clang-format --diff --extensions c,cc,h "$base" 2>&1) || true
if grep -q '^diff --git' <<<"$out"; then
  echo "these lines changed since $base are not formatted as .clang-format says;"
  echo "run: git clang-format $base"
  echo "$out"
  exit 1
fi
echo "formatted: every C/C++ line changed since $base"
