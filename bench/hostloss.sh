#!/usr/bin/env bash
# Goodput of a job over many seeds without the swarm's extra faults: only the job's own failure
# rates (docs/simulator.md, "Hot spares"). Usage: bench/hostloss.sh [SEEDS] [JOB...]
# (default: 300 seeds of bench/llama3-hostloss.toml and bench/llama3-hostloss-spares.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-300}
shift || true
jobs=("$@")
[ ${#jobs[@]} -gt 0 ] || jobs=(bench/llama3-hostloss.toml bench/llama3-hostloss-spares.toml)
ddprun=${DDPRUN:-build/release/cli/ddprun}
for job in "${jobs[@]}"; do
  start=$(date +%s)
  for seed in $(seq 1 "$seeds"); do
    "$ddprun" --simulate "$job" --seed "$seed" --quiet || true
  done | python3 -c '
import re, sys
job, start, end = sys.argv[1], int(sys.argv[2]), None
codes, goodput, bad = {}, [], 0
for line in sys.stdin:
    if m := re.search(r"outcome: +job exit code (\d+)", line):
        codes[int(m.group(1))] = codes.get(int(m.group(1)), 0) + 1
    if m := re.search(r"goodput: +([0-9.]+)%", line):
        goodput.append(float(m.group(1)))
    bad += "INVARIANT VIOLATED" in line
goodput.sort()
at = lambda q: goodput[int(q * (len(goodput) - 1) + 0.5)]
import time
print(f"{job}: {len(goodput)} seeds, goodput mean {sum(goodput) / len(goodput):.1f}%, "
      f"p10 {at(0.1):.1f}%, median {at(0.5):.1f}%, p90 {at(0.9):.1f}%; "
      + ", ".join(f"exit {c}: {n}" for c, n in sorted(codes.items()))
      + f"; {bad} invariant violations; {int(time.time()) - start} s")
' "$job" "$start"
done
