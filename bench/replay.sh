#!/usr/bin/env bash
# The cost of `ddprun --simulate JOB --replay LOGS` as the replayed run grows: event logs of a
# 2-node job whose every round but the last fails on one rank's exit (the same records as
# tests/cli/event_logs_test.cc writes), replayed at ROUNDS rounds (default 16000 40000 100000),
# CPU time (user + sys) and peak memory of each replay, and with --beat-by-beat beside it.
# Linear growth: the CPU time per round stays flat. ddprun's own cost: torchrun has no replay.
#   DDPRUN (default build/ci/cli/ddprun), ROUNDS
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
DDPRUN=${DDPRUN:-$REPO/build/ci/cli/ddprun}
ROUNDS=${ROUNDS:-16000 40000 100000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cat >"$work/job.toml" <<'EOF'
version = 1
[job]
name = "long"
command = ["x"]
[cluster]
nnodes = 2
[trainer]
accelerator = "cpu"
devices = 2
num_nodes = 2
[restart]
max_restarts = 10000
backoff = "0s"
EOF

write_run() {  # FOLDER ROUNDS
  python3 - "$1" "$2" <<'PY'
import os, sys
folder, rounds = sys.argv[1], int(sys.argv[2])
os.makedirs(folder, exist_ok=True)
out = [open(os.path.join(folder, "events-node%d.jsonl" % n), "w") for n in (0, 1)]
def line(node, kind, ms, fields):
    out[node].write('{"v":1,"event":"%s","unix_ms":%d,"mono_ms":%d,"node":%d,"host":"h%d",%s}\n'
                    % (kind, 1700000000000 + ms, 5000 + ms, node, node, fields))
start = '"job":"long","fingerprint":"abc","nnodes":2,"spares":0,"nproc":2'
line(0, "agent-start", 0, start)
line(1, "agent-start", 100, start)
for r in range(rounds):
    t = 1000 + r * 10000
    line(0, "round-begin", t, '"round":%d,"restarts_used":%d,"nodes":2' % (r, r))
    line(0, "workers-start", t + 10, '"round":%d,"plays":0,"ranks":[0,1]' % r)
    line(1, "workers-start", t + 10, '"round":%d,"plays":1,"ranks":[2,3]' % r)
    if r == rounds - 1:
        line(0, "job-result", t + 50000, '"exit_code":0,"restarts_used":%d,"summary":"ok"' % r)
        break
    line(1, "worker-exit", t + 5000, '"round":%d,"rank":3,"local_rank":1,"exit_code":7,"signal":0,'
         '"stopped":false,"kinds":["exit:7"],"error":""' % r)
    line(0, "round-failed", t + 5010, '"round":%d,"peer":1,"rank":3,"kinds":["exit:7"],"cause":"rank 3 exited 7"' % r)
    line(1, "stop-round", t + 5020, '"round":%d,"cause":"rank 3 exited 7","last":false' % r)
    line(1, "signal-workers", t + 5030, '"round":%d,"signal":"SIGTERM"' % r)
    for rank in (0, 1, 2):
        line(rank // 2, "worker-exit", t + 5040,
             '"round":%d,"rank":%d,"local_rank":%d,"exit_code":0,"signal":15,"stopped":true' % (r, rank, rank % 2))
    for node in (0, 1):
        line(node, "round-end", t + 5050, '"round":%d,"outcome":"stopped","stopped":[1]' % r)
    line(0, "restart", t + 6000, '"restart":%d,"max_restarts":10000,"round":%d,"backoff_ms":0' % (r + 1, r + 1))
end = 60000 + rounds * 10000
line(0, "agent-exit", end, '"exit_code":0')
line(1, "agent-exit", end, '"exit_code":0')
PY
}

printf '%-9s %-16s %10s %12s %10s\n' rounds mode "cpu s" "cpu us/round" "peak MiB"
for rounds in $ROUNDS; do
  write_run "$work/r$rounds" "$rounds"
  for mode in stretches beat-by-beat; do
    extra=()
    [[ $mode == beat-by-beat ]] && extra=(--beat-by-beat)
    /usr/bin/time -f '%U %S %M' -o "$work/time" \
      "$DDPRUN" --simulate "$work/job.toml" --replay "$work/r$rounds" --quiet "${extra[@]}" >"$work/out" 2>&1 || true
    tail -n 1 "$work/time" >"$work/time.last" && mv "$work/time.last" "$work/time"
    read -r user sys kib <"$work/time"
    awk -v r="$rounds" -v m="$mode" -v u="$user" -v s="$sys" -v k="$kib" \
      'BEGIN { c = u + s; printf "%-9d %-16s %10.2f %12.1f %10.1f\n", r, m, c, c * 1e6 / r, k / 1024 }'
  done
done
