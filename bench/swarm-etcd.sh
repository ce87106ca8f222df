#!/usr/bin/env bash
# The long etcd swarm (issue 16): SEEDS seeds (default 50,000) from seed BASE (default 1) of
# bench/swarm-etcd.toml (the coordinator's role and state in a modelled 3-member etcd; the
# swarm adds etcd's faults and the loss of the first coordinator's host), with --quiet, split
# over PARALLEL processes (default: the number of CPUs). Prints every failed seed with its
# repro command, then one line: seeds, failures, wall time. CI runs 300 seeds
# (tests/sim/etcd_test.cc); this is the long version. bench/swarm.sh runs the other jobs.
#   bench/swarm-etcd.sh [BUILD_DIR]      (default build/release; SEEDS=N BASE=N PARALLEL=N)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
build="${1:-$root/build/release}"
seeds="${SEEDS:-50000}"
base="${BASE:-1}"
parallel="${PARALLEL:-$(nproc)}"
if [[ ! -x "$build/cli/ddprun" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" --target ddprun
fi
ddprun="$build/cli/ddprun"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
job=bench/swarm-etcd.toml
chunk=$(( (seeds + parallel - 1) / parallel ))
start=$(date +%s.%N)
pids=()
for (( i = 0; i < parallel; i++ )); do
  first=$(( i * chunk ))
  (( first >= seeds )) && break
  count=$(( seeds - first < chunk ? seeds - first : chunk ))
  (cd "$root" && exec "$ddprun" --simulate "$job" --swarm "$count" --seed $(( base + first )) --quiet) \
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
grep -hv '^swarm' "$out"/part.* || true
failed=$(grep -h '^swarm: ' "$out"/part.* | sed -E 's/.* ([0-9]+) failed$/\1/' | awk '{ n += $1 } END { print n + 0 }')
echo
printf '%-30s %d seeds (%d..%d), %d failed  (%.0f s)\n' "$job" "$seeds" "$base" $(( base + seeds - 1 )) \
  "$failed" "$(awk "BEGIN { print $end - $start }")"
(( failed > 0 )) && exit 70
exit 0
