#!/usr/bin/env bash
# Quiet stretches computed or run beat by beat give the same run (sim/quiet.cc): SEEDS seeds
# (default 100,000) from BASE (default 1000) of each job, with the swarm's random faults, split
# over PARALLEL processes; each seed runs both ways and every printed line is compared
# (bench/quiet_equivalence.cc). JOBS="a.toml b.toml" picks the jobs; SHAPES=N adds N seeds of
# bench/swarm-shapes.toml with --vary-shape. Prints each differing seed and one line per job.
# Figures: docs/simulator.md.
#   bench/quiet-equivalence.sh [BUILD_DIR]      (default build/release)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
build="${1:-$root/build/release}"
seeds="${SEEDS:-100000}"
base="${BASE:-1000}"
parallel="${PARALLEL:-$(nproc)}"
shapes="${SHAPES:-0}"
tool="$build/bench/ddprun_quiet_equivalence"
if [[ ! -x "$tool" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" --target ddprun_quiet_equivalence
fi
jobs="${JOBS:-examples/laptop.toml examples/lightning-2x8.toml examples/lightning-4x8.toml bench/swarm64.toml
  bench/swarm-shrink.toml bench/swarm-spares.toml bench/swarm-hangs.toml bench/swarm-etcd-30s.toml}"
status=0
run() {  # job count extra...
  local job=$1 count=$2; shift 2
  local chunk=$(( (count + parallel - 1) / parallel )) pids=() out
  out="$(mktemp -d)"
  for (( i = 0; i < parallel; i++ )); do
    local first=$(( i * chunk ))
    (( first >= count )) && break
    local n=$(( count - first < chunk ? count - first : chunk ))
    (cd "$root" && exec "$tool" "$job" $(( base + first )) "$n" "$@") > "$out/part.$i" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  cat "$out"/part.* | grep -v '^quiet equivalence:' || true
  cat "$out"/part.* | grep '^quiet equivalence:' | awk -v job="$job" '
    { n += $3; d += $8; s += $10; b += $12; e1 += $17; e2 += $19 }
    END { printf "%s: %d seeds, %d differ; %d stretches, %d beats computed; events run %d computed, %d beat by beat\n", job, n, d, s, b, e1, e2 }'
  rm -rf "$out"
}
for job in $jobs; do run "$job" "$seeds"; done
if (( shapes > 0 )); then run bench/swarm-shapes.toml "$shapes" --vary-shape; fi
exit $status
