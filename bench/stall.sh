#!/usr/bin/env bash
# What stall of an agent ddprun tolerates: 2 real agents on 127.0.0.1, heartbeat = 1s, workers
# that sleep 8 s, max_restarts = 0. Once the round runs, node 1's agent (only the agent, not its
# workers) is stopped with SIGSTOP for S seconds, at a random point of the heartbeat interval,
# then continued. The job succeeds when the stall was tolerated and fails (node 1 lost) when it
# was not. Prints, per stall length, how many of TRIALS runs declared node 1 lost.
#   bench/stall.sh [DDPRUN]          (default: build/release/cli/ddprun)
#   STALLS="1.0 1.5 2.0 2.5 3.0 3.5 4.5" TRIALS=4
# Every agent is bounded: a watchdog SIGKILLs it by pid after 60 s (its guardian then stops its
# workers).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
DDPRUN=${1:-$REPO/build/release/cli/ddprun}
STALLS=${STALLS:-"1.0 1.5 2.0 2.5 3.0 3.5 4.5"}
TRIALS=${TRIALS:-4}
work=$(mktemp -d "${TMPDIR:-/tmp}/ddprun-stall.XXXXXX")
trap 'rm -rf "$work"' EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

trial() {  # STALL -> prints "lost" or "tolerated"
  local stall=$1 dir port n0 n1
  dir=$(mktemp -d "$work/t.XXXX")
  port=$(free_port)
  cat > "$dir/job.toml" <<TOML
version = 1
[job]
name = "stall"
command = ["sleep", "8"]
[cluster]
nnodes = 2
master_addr = "127.0.0.1"
master_port = $port
[trainer]
accelerator = "cpu"
devices = 1
num_nodes = 2
[timeouts]
rendezvous = "20s"
heartbeat = "1s"
stop_grace = "2s"
TOML
  "$DDPRUN" "$dir/job.toml" --node-rank 0 > "$dir/n0.out" 2>&1 & n0=$!
  "$DDPRUN" "$dir/job.toml" --node-rank 1 > "$dir/n1.out" 2>&1 & n1=$!
  (sleep 60; kill -9 "$n0" "$n1" 2>/dev/null) & local watchdog=$!
  for _ in $(seq 100); do grep -q "round 0: starting" "$dir/n1.out" 2>/dev/null && break; sleep 0.1; done
  sleep "0.$((RANDOM % 10))"
  kill -STOP "$n1"; sleep "$stall"; kill -CONT "$n1"
  local rc0=0
  wait "$n0" || rc0=$?
  wait "$n1" || true
  kill "$watchdog" 2>/dev/null || true
  if [[ $rc0 == 0 ]]; then echo tolerated; else echo lost; fi
}

printf '%-8s %s\n' "stall" "declared lost (of $TRIALS runs), heartbeat = 1s, loss bound = 3s"
for s in $STALLS; do
  lost=0
  for _ in $(seq "$TRIALS"); do [[ $(trial "$s") == lost ]] && lost=$((lost + 1)); done
  printf '%-8s %d\n' "${s}s" "$lost"
done
