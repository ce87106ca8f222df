#!/usr/bin/env bash
# The long version of the impostor check (issue 25): RUNS executions (default 1,000,000) of
# tests/fuzz/auth_fuzz, an agent with a shared secret against a peer that does not know it and
# sends anything (every message of the protocol, forged challenges, raw frames, closes, time).
# Any message believed, printed, acted on or answered with the job aborts with the input.
# Figures: docs/running.md (Security).
#   bench/hostile-auth.sh            (RUNS=N; builds the fuzz preset with clang)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
runs="${RUNS:-1000000}"
cd "$root"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target auth_fuzz
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp tests/fuzz/corpus/auth/* "$work"/
start=$(date +%s)
build/fuzz/tests/fuzz/auth_fuzz -runs="$runs" -print_final_stats=1 "$work" 2>&1 | grep -E "^stat::|Done|invariant|SUMMARY"
echo "hostile-auth: $runs executions, 0 violations, $(( $(date +%s) - start )) s"
