#!/usr/bin/env bash
# Whether a change that is meant to change no behaviour (a reshape of the core, issue 42) kept
# the simulator's output byte for byte: runs BEFORE and AFTER (two ddprun binaries) on every
# example job and every bench/swarm*.toml job, SEEDS single simulations each (their whole
# timelines) and one swarm of SWARM seeds each (its failures and counts), and diffs them; a job
# whose one simulation takes over 5 s is compared on one seed only.
# Prints one line per job and the first differing lines; exits 1 when any output differs.
#   bench/same-output.sh BEFORE AFTER      (SEEDS=20 SWARM=2000 BASE=1000)
set -euo pipefail
before=$(realpath "$1") after=$(realpath "$2")
cd "$(dirname "$0")/.."
seeds="${SEEDS:-20}" swarm="${SWARM:-2000}" base="${BASE:-1000}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
for job in examples/*.toml bench/swarm*.toml; do
  # Example jobs a simulation cannot run (a script the simulator does not know) are skipped;
  # a job whose one simulation takes over 5 s (thousands of nodes) is compared on that one.
  started=$(date +%s%N)
  "$before" --simulate "$job" --seed "$base" >/dev/null 2>&1 || [[ $? -le 1 ]] || continue
  runs=$seeds count=$swarm
  if (( $(date +%s%N) - started > 5000000000 )); then runs=1 count=0; fi
  for which in before after; do
    binary=${!which}
    {
      for ((s = base; s < base + runs; s++)); do
        echo "== seed $s"
        "$binary" --simulate "$job" --seed "$s" 2>&1 || echo "exit $?"
      done
      if ((count > 0)); then
        echo "== swarm"
        "$binary" --simulate "$job" --swarm "$count" --seed "$base" --quiet 2>&1
      fi
    } >"$out/$which"
  done
  if cmp -s "$out/before" "$out/after"; then
    echo "same: $job ($(wc -l <"$out/after") lines)"
  else
    echo "DIFFERS: $job"
    diff "$out/before" "$out/after" | head -20 || true  # diff stops on the closed pipe
    status=1
  fi
done
exit $status
