#!/usr/bin/env bash
# Goodput of a job over many seeds without the swarm's extra faults: only the job's own failure
# rates (docs/simulator.md, "Hot spares"). Usage: bench/hostloss.sh [SEEDS] [JOB...]
# (default: 200 seeds of bench/llama3-hostloss.toml and bench/llama3-hostloss-spares.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-200}
shift || true
jobs=("$@")
[ ${#jobs[@]} -gt 0 ] || jobs=(bench/llama3-hostloss.toml bench/llama3-hostloss-spares.toml bench/llama3-hostloss-shrink.toml)
ddprun=${DDPRUN:-build/release/cli/ddprun}
for job in "${jobs[@]}"; do
  start=$(date +%s)
  for seed in $(seq 1 "$seeds"); do
    "$ddprun" --simulate "$job" --seed "$seed" --quiet || true
  done | python3 -c '
import re, sys
job, start, end = sys.argv[1], int(sys.argv[2]), None
codes, goodput, kept, bad = {}, [], [], 0
def ns(text):  # "6d18h", "26m51s", "450ms" as the summary writes them
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(v) * units[u] for v, u in re.findall(r"([0-9.]+)(ms|d|h|m|s)", text))
for line in sys.stdin:
    if m := re.search(r"training: +(\S+) of (\S+) kept", line):
        kept.append(ns(m.group(1)) / ns(m.group(2)))
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
      f"training kept {100 * sum(kept) / len(kept):.1f}% of train_time; "
      + ", ".join(f"exit {c}: {n}" for c, n in sorted(codes.items()))
      + f"; {bad} invariant violations; {int(time.time()) - start} s")
' "$job" "$start"
done
