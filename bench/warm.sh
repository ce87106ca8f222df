#!/usr/bin/env bash
# Warm starts (job.preload) on a real gloo DDP job, 2 nodes x 2 workers on 127.0.0.1
# (bench/w_torch.py): ddprun cold, ddprun warm (preload = ["torch", "torch.distributed",
# "torch.nn.parallel"]) and torchrun (c10d rendezvous, --max_restarts 1), in one run. Rank 3
# raises at step FAIL_STEP of round 0; backoff = "0s".
#   first start:  agents started -> every rank has done its first step of round 0
#   restart:      rank 3's failure -> every rank has done its first step of round 1
#   memory:       PSS (/proc/PID/smaps_rollup) of node 0's agent, its template and its workers,
#                 sampled while round 1 trains (pages the workers share with the template
#                 count once, split among them)
# For ddprun, the event logs of both nodes split the restart into its steps (restart-* rows).
#   RUNS (default 3), TR_RUNS (torchrun, default 1), MODES (default "cold warm torchrun")
#   WORKLOAD=lightning: the same job as a real Lightning Trainer (bench/w_lightning_fail.py),
#   preload = ["torch", "lightning"]; LIGHTNING_PATH must name the src/ folders of lightning
#   2.2.5, lightning-utilities 0.10.1 and torchmetrics 1.2.1 (not part of the repository).
#   HEARTBEAT (default 1s); BUSY=N runs N busy loops beside the job (the stall check).
source "$(dirname "$0")/common.sh"
RUNS=${RUNS:-3}
TR_RUNS=${TR_RUNS:-1}
WORKLOAD=${WORKLOAD:-torch}
HEARTBEAT=${HEARTBEAT:-1s}
S=warm
W_TORCH=$BENCH_DIR/w_torch.py
PRELOAD='["torch", "torch.distributed", "torch.nn.parallel"]'
if [[ $WORKLOAD == lightning ]]; then
  [[ -n ${LIGHTNING_PATH:-} ]] || { log "WORKLOAD=lightning: set LIGHTNING_PATH to the Lightning sources' src/ folders"; exit 1; }
  S=warm-lightning
  W_TORCH=$BENCH_DIR/w_lightning_fail.py
  PRELOAD='["torch", "lightning"]'
  export PYTHONPATH=$LIGHTNING_PATH${PYTHONPATH:+:$PYTHONPATH}
fi
BUSY_PIDS=()
for ((b = 0; b < ${BUSY:-0}; b++)); do
  (while :; do :; done) &
  BUSY_PIDS+=($!)
done
trap 'for p in "${BUSY_PIDS[@]}"; do kill "$p" 2>/dev/null; done' EXIT
export STEPS=${STEPS:-60} STEP_S=${STEP_S:-0.05} FAIL_RANK=3 FAIL_STEP=${FAIL_STEP:-5}

pss_kb() {  # PID... : the sum of their PSS in kB (0 for those gone)
  local p kb=0 v
  for p in "$@"; do
    v=$(awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup" 2>/dev/null || true)
    kb=$((kb + ${v:-0}))
  done
  echo "$kb"
}
children_of() { cat "/proc/$1/task/"*/children 2>/dev/null | tr ' ' '\n' | grep . || true; }
kill_recorded() {  # kills the recorded workers that still run the job's script (or the template)
  local p
  [[ -f "$BENCH_MARKS.pids" ]] || return 0
  for p in $(cat "$BENCH_MARKS.pids"); do
    if tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q "$(basename "$W_TORCH")\|template.py"; then kill -KILL "$p" 2>/dev/null || true; fi
  done
}

one_run() {  # MODE DIR
  local mode=$1 dir=$2 run i t0 extra=""
  run=$(mktemp -d "$dir/run.XXXX")
  new_marks "$run"
  free_port
  [[ $mode == warm ]] && extra="preload = $PRELOAD"
  if [[ $mode != torchrun ]]; then
    ddprun_job "$run/job.toml" "warm-$mode" 2 2 "$PORT" 1 60s "[\"$PYTHON\", \"$W_TORCH\"]"
    # job.preload belongs to [job]: insert it after the command line.
    [[ -n $extra ]] && sed -i "/^command = /a $extra" "$run/job.toml"
    sed -i "s/^stop_grace = .*/stop_grace = \"5s\"\nheartbeat = \"$HEARTBEAT\"/" "$run/job.toml"
  fi
  t0=$EPOCHREALTIME
  for i in 1 0; do
    if [[ $mode == torchrun ]]; then
      GLOO_SOCKET_IFNAME=lo start_agent "$run" "n$i" 120 "${TORCHRUN[@]}" --nnodes 2 --nproc_per_node 2 \
        --rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$PORT" --rdzv_id "warm$PORT" --max_restarts 1 "$W_TORCH"
    else
      GLOO_SOCKET_IFNAME=lo start_agent "$run" "n$i" 120 "$DDPRUN" "$run/job.toml" --node-rank "$i"
    fi
  done
  # Memory while round 1 trains: node 0's agent (torchrun: its python), template, workers.
  local deadline=$((SECONDS + 110)) agent="" sampled=""
  while (($(mark_times train 1 | wc -l) < 4)) && ((SECONDS < deadline)); do sleep 0.05; done
  agent=$(agent_pid "$run" n0)
  if [[ -n $agent ]] && (($(mark_times train 1 | wc -l) == 4)); then
    local kids template="" workers=() k
    kids=$(children_of "$agent")
    for k in $kids; do
      if tr '\0' ' ' 2>/dev/null <"/proc/$k/cmdline" | grep -q 'template.py' && ! grep -q "^$k\$" "$BENCH_MARKS.pids"; then
        template=$k
      elif grep -q "^$k\$" "$BENCH_MARKS.pids"; then
        workers+=("$k")
      fi
    done
    sampled="$(pss_kb "$agent") $(pss_kb $template) $(pss_kb "${workers[@]}") ${#workers[@]}"
  fi
  wait_agents "$run" 100 n0 n1
  local fail start_all restart_all rc0 rc1
  rc0=$(cut -d' ' -f1 "$run/n0.rc" 2>/dev/null || echo -)
  rc1=$(cut -d' ' -f1 "$run/n1.rc" 2>/dev/null || echo -)
  fail=$(mark_times fail 0 | head -1)
  start_all=$(mark_times train 0 | sort -g | tail -1)
  restart_all=$(mark_times train 1 | sort -g | tail -1)
  # A node reported stalled (its loop did not run for longer than the heartbeat allows).
  { grep -h -c "stalled" "$run/n0.out" "$run/n1.out" 2>/dev/null || true; } | awk '{n += $1} END {print n + 0}' >>"$dir/stalls"
  if [[ $rc0 == 0 && $rc1 == 0 && -n $fail && -n $restart_all && $(mark_times train 1 | wc -l) == 4 ]]; then
    awk -v t0="$t0" -v s="$start_all" -v f="$fail" -v r="$restart_all" 'BEGIN {printf "%.4f %.4f\n", s - t0, r - f}' >>"$dir/times"
    [[ -n $sampled ]] && echo "$sampled" >>"$dir/memory"
    if [[ $mode != torchrun ]]; then
      # The steps of the restart from both nodes' event logs (monotonic times of one clock).
      "$PYTHON" - "$run" "$fail" >>"$dir/steps" <<'PY' || log "$mode: no event-log steps"
import glob, json, sys
events = []
for path in glob.glob(sys.argv[1] + "/logs/*/latest-n*/events-node*.jsonl"):
    events += [json.loads(line) for line in open(path)]
t = lambda e: e["unix_ms"]
def first(kind, **match):
    found = [t(e) for e in events if e["event"] == kind and all(e.get(k) == v for k, v in match.items())]
    return min(found) if found else None
def last(kind, **match):
    found = [t(e) for e in events if e["event"] == kind and all(e.get(k) == v for k, v in match.items())]
    return max(found) if found else None
fail_mark = float(sys.argv[2]) * 1000.0  # rank 3's "fail" mark (epoch ms), just before it raises
exit_seen = first("worker-exit", round=0, rank=3)
stopped = last("worker-exit", round=0)
begin = first("workers-start", round=1)
started = last("workers-started", round=1)
print(" ".join("%.1f" % (x - fail_mark) if x is not None else "-" for x in (exit_seen, stopped, begin, started)))
PY
    fi
  else
    log "$mode: run failed (rc $rc0/$rc1); outputs in $run"
    cp -r "$run" "$BENCH_OUT/warm-failed-$mode-$(date +%s)" 2>/dev/null || true
  fi
  kill_groups
  kill_recorded
}

for mode in ${MODES:-cold warm torchrun}; do
  dir=$(scratch "warm-$mode")
  runs=$RUNS
  [[ $mode == torchrun ]] && runs=$TR_RUNS
  name="ddprun, $mode"
  [[ $mode == torchrun ]] && name="torchrun (c10d)"
  for ((r = 0; r < runs; r++)); do
    wait_quiet "warm: $name"
    one_run "$mode" "$dir"
  done
  if [[ $mode == torchrun ]]; then
    cmd="GLOO_SOCKET_IFNAME=lo $(printf '%s ' "${TORCHRUN[@]}")--nnodes 2 --nproc_per_node 2 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:P --rdzv_id X --max_restarts 1 $(rel "$W_TORCH") (on 2 agents)"
  else
    cmd="STEPS=$STEPS STEP_S=$STEP_S FAIL_STEP=$FAIL_STEP GLOO_SOCKET_IFNAME=lo $(rel "$DDPRUN") job.toml --node-rank 0|1 (nnodes = 2, devices = 2, max_restarts = 1, backoff = \"0s\", heartbeat = \"$HEARTBEAT\", command = [\"python3\", \"$(rel "$W_TORCH")\"]$(if [[ $mode == warm ]]; then echo ", preload = $PRELOAD"; fi))${BUSY:+ beside $BUSY busy loops}"
  fi
  awk '{print $1}' "$dir/times" 2>/dev/null | record_stats warm-first "$S" "agents start -> every rank trained its first step" "$name" s "$cmd"
  awk '{print $2}' "$dir/times" 2>/dev/null | record_stats warm-restart "$S" "failure -> every rank trained its first step of round 1" "$name" s "$cmd"
  cat "$dir/stalls" 2>/dev/null | record_stats warm-stalls "$S" "\"stalled\" lines on the two nodes' consoles, per run" "$name" lines "$cmd"
  awk '{print $1 / 1024}' "$dir/memory" 2>/dev/null | record_stats warm-pss-agent "$S" "node 0: agent PSS" "$name" MiB "$cmd"
  if [[ $mode == warm ]]; then
    awk '{print $2 / 1024}' "$dir/memory" 2>/dev/null | record_stats warm-pss-template "$S" "node 0: template PSS" "$name" MiB "$cmd"
  fi
  awk '{print $3 / 1024}' "$dir/memory" 2>/dev/null | record_stats warm-pss-workers "$S" "node 0: its 2 workers' PSS together" "$name" MiB "$cmd"
  if [[ $mode != torchrun ]]; then
    awk '{print $1 / 1000}' "$dir/steps" 2>/dev/null | record_stats warm-step-exit "$S" "failure (rank 3 raises) -> its agent has its exit (event log)" "$name" s "$cmd"
    awk '{print $2 / 1000}' "$dir/steps" 2>/dev/null | record_stats warm-step-stopped "$S" "failure -> the last worker of round 0 is gone (event log)" "$name" s "$cmd"
    awk '{print $3 / 1000}' "$dir/steps" 2>/dev/null | record_stats warm-step-begin "$S" "failure -> the first agent asks for round 1's workers (event log)" "$name" s "$cmd"
    awk '{print $4 / 1000}' "$dir/steps" 2>/dev/null | record_stats warm-step-started "$S" "failure -> the last of round 1's processes exists (event log)" "$name" s "$cmd"
  fi
done
log "results in $RESULTS"
