#!/usr/bin/env bash
# The simulator at scale: rendezvous + one worker failure + a restart + success, for
# 16, 1,024 and 16,384 nodes x 8 GPUs (bench/sim_scale.toml); then the 54-day Llama-3-like run,
# and the first hour of it with a 2 s heartbeat and host crashes (bench/llama3-54d-2s.toml).
# Prints one line per run: events by kind, wall and CPU time, events/s, peak RSS.
# Results: docs/performance.md.
#   bench/sim_scale.sh [BUILD_DIR]      (default build/release)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
build="${1:-$root/build/release}"
if [[ ! -x "$build/bench/ddprun_sim_bench" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" --target ddprun_sim_bench
fi
for nodes in 16 1024 16384; do
  "$build/bench/ddprun_sim_bench" "$here/sim_scale.toml" "$nodes"
done
"$build/bench/ddprun_sim_bench" "$root/examples/llama3-54d.toml" 2048
# The same job with a 2 s heartbeat and host crashes: its first hour only (all 54 days would
# take hours: docs/performance.md, "Issue 26, part 3").
"$build/bench/ddprun_sim_bench" "$root/bench/llama3-54d-2s.toml" 2048 405 --max-time=1h || true
