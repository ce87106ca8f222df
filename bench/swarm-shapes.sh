#!/usr/bin/env bash
# The shape swarm (issue 26): bench/swarm.sh on bench/swarm-shapes.toml with --vary-shape, so
# each seed runs its own job shape (1-64 nodes, 1-8 processes, heartbeat, stop_grace, backoff,
# restarts, spares, min_nodes, timeouts.progress, failure rates, etcd on or off) besides its
# random faults. A failed seed's repro line repeats its shape as --set flags.
#   bench/swarm-shapes.sh [BUILD_DIR]      (SEEDS=N BASE=N PARALLEL=N as bench/swarm.sh)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
JOBS=bench/swarm-shapes.toml SWARM_ARGS=--vary-shape exec "$here/swarm.sh" "$@"
