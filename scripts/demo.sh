#!/usr/bin/env bash
# Installs what is missing, builds ddprun (release) and runs the main example: the simulator
# on examples/laptop.toml (2 nodes x 2 workers; a node crashes, the job restarts and finishes).
# Extra arguments go to ddprun, e.g. `scripts/demo.sh --report report.html`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target ddprun
exec build/release/cli/ddprun --simulate examples/laptop.toml "$@"
