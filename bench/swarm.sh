#!/usr/bin/env bash
# The long swarm (issue 10): SEEDS seeds (default 100,000) from seed BASE (default 1000) on each
# example job, on a 64-node job (bench/swarm64.toml) and on two jobs that detect hung ranks
# (bench/swarm-hangs.toml, bench/swarm-hangs-auto.toml), on one that shrinks and quarantines
# (bench/swarm-shrink.toml) and on one whose coordinator lives in etcd (bench/swarm-etcd.toml),
# with --quiet, split over PARALLEL processes (default: the number of CPUs); JOBS="a.toml
# b.toml" runs those instead. Prints every failed seed with its repro command, then one line per
# job: seeds, failures, wall time. CI runs 5,000 seeds per example (tests/sim/swarm_test.cc);
# this is the long version. Figures: docs/simulator.md. SWARM_ARGS adds flags to every run
# (bench/swarm-shapes.sh passes --vary-shape); DDPRUN=path runs that binary instead.
#   bench/swarm.sh [BUILD_DIR]      (default build/release; SEEDS=N BASE=N PARALLEL=N JOBS=...)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
build="${1:-$root/build/release}"
seeds="${SEEDS:-100000}"
base="${BASE:-1000}"
parallel="${PARALLEL:-$(nproc)}"
if [[ -z "${DDPRUN:-}" && ! -x "$build/cli/ddprun" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" --target ddprun
fi
ddprun="${DDPRUN:-$build/cli/ddprun}"
read -r -a extra <<< "${SWARM_ARGS:-}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
summary=()
status=0
chunk=$(( (seeds + parallel - 1) / parallel ))
jobs="${JOBS:-examples/laptop.toml examples/lightning-2x8.toml examples/lightning-4x8.toml bench/swarm64.toml
  bench/swarm-hangs.toml bench/swarm-hangs-auto.toml bench/swarm-shrink.toml bench/swarm-etcd.toml}"
for job in $jobs; do
  start=$(date +%s.%N)
  pids=()
  for (( i = 0; i < parallel; i++ )); do
    first=$(( i * chunk ))
    (( first >= seeds )) && break
    count=$(( seeds - first < chunk ? seeds - first : chunk ))
    (cd "$root" && exec "$ddprun" --simulate "$job" --swarm "$count" --seed $(( base + first )) --quiet ${extra[@]+"${extra[@]}"}) \
      > "$out/part.$i" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    rc=0
    wait "$pid" || rc=$?
    # Exit 70 means some seed failed; anything else but 0 is a broken run.
    if [[ $rc -ne 0 && $rc -ne 70 ]]; then
      echo "swarm: $job: ddprun exited $rc" >&2
      cat "$out"/part.* >&2
      exit 1
    fi
  done
  end=$(date +%s.%N)
  grep -hv '^swarm: ' "$out"/part.* || true
  failed=$(grep -h '^swarm: ' "$out"/part.* | sed -E 's/.* ([0-9]+) failed$/\1/' | awk '{ n += $1 } END { print n + 0 }')
  (( failed > 0 )) && status=70
  summary+=("$(printf '%-30s %d seeds (%d..%d), %d failed  (%.0f s)' "$job" "$seeds" "$base" \
    $(( base + seeds - 1 )) "$failed" "$(awk "BEGIN { print $end - $start }")")")
  rm -f "$out"/part.*
done
echo
printf '%s\n' "${summary[@]}"
exit $status
