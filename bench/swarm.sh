#!/usr/bin/env bash
# The long swarm (issue 10): SEEDS seeds (default 100,000) from seed BASE (default 1000) on each
# example job and on a 64-node job (bench/swarm64.toml), with --quiet. Prints each job's
# failed seeds with their repro commands, then one line per job: seeds, failures, wall time.
# CI runs 5,000 seeds per example (tests/sim/swarm_test.cc); this is the long version.
# Figures: docs/simulator.md, "Invariants and swarm".
#   bench/swarm.sh [BUILD_DIR]      (default build/release; SEEDS=N BASE=N to change the range)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
build="${1:-$root/build/release}"
seeds="${SEEDS:-100000}"
base="${BASE:-1000}"
if [[ ! -x "$build/runner/cli/ddprun" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" --target ddprun
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
summary=()
status=0
for job in examples/laptop.toml examples/lightning-2x8.toml examples/lightning-4x8.toml bench/swarm64.toml; do
  start=$(date +%s.%N)
  rc=0
  (cd "$root" && "$build/runner/cli/ddprun" --simulate "$job" --swarm "$seeds" --seed "$base" --quiet) \
    > "$out/run.txt" || rc=$?
  end=$(date +%s.%N)
  # Exit 70 means some seed failed; anything else but 0 is a broken run.
  if [[ $rc -ne 0 && $rc -ne 70 ]]; then
    echo "swarm: $job: ddprun exited $rc" >&2
    cat "$out/run.txt" >&2
    exit 1
  fi
  [[ $rc -eq 70 ]] && status=70
  grep -v '^swarm: ' "$out/run.txt" || true
  line=$(grep '^swarm: ' "$out/run.txt")
  summary+=("$(printf '%-30s %s  (%.0f s)' "$job" "${line#swarm: }" "$(awk "BEGIN { print $end - $start }")")")
done
echo
printf '%s\n' "${summary[@]}"
exit $status
