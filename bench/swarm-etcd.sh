#!/usr/bin/env bash
# The long etcd swarm (issue 16): SEEDS seeds (default 50,000) from seed BASE (default 1) of
# bench/swarm-etcd.toml (the coordinator's role and state in a modelled 3-member etcd; the
# swarm adds etcd's faults and the loss of the first coordinator's host), through bench/swarm.sh.
# CI runs 300 seeds (tests/sim/etcd_test.cc); this is the long version.
#   bench/swarm-etcd.sh [BUILD_DIR]      (default build/release; SEEDS=N BASE=N PARALLEL=N)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
JOBS=bench/swarm-etcd.toml SEEDS="${SEEDS:-50000}" BASE="${BASE:-1}" exec "$here/swarm.sh" "$@"
