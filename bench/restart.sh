#!/usr/bin/env bash
# Restart: 2 nodes x 2 workers, rank 3 exits 1 after 1 s in round 0 only (bench/w_mark.sh,
# MODE=fail FAIL_ROUNDS=0); time from its "fail" mark until the next round's workers run
# ("start" marks of round 1, first and last). Zero backoff: ddprun restart.max_restarts = 1,
# backoff = "0s"; torchrun --max_restarts 1 (no backoff setting; it restarts at its next
# monitor tick, and only on the failing node: 2 workers, not 4). The run is stopped once
# round 1 has started (or after ROUND1_WAIT_S).
#   RUNS (ddprun, default 3), TR_RUNS (torchrun, default 1 per monitor interval)
source "$(dirname "$0")/common.sh"
RUNS=${RUNS:-3}
TR_RUNS=${TR_RUNS:-1}
ROUND1_WAIT_S=${ROUND1_WAIT_S:-20}
S=restart
export MODE=fail FAIL_RANK=3 FAIL_AFTER_S=1 SLEEP_S=30 FAIL_ROUNDS=0

one_run() {  # IMPL MON DIR
  local impl=$1 mon=$2 dir=$3 run i expect=4
  run=$(mktemp -d "$dir/run.XXXX")
  new_marks "$run"
  free_port
  [[ $impl == ddprun ]] && ddprun_job "$run/job.toml" restart 2 2 "$PORT" 1 30s "[\"bash\", \"$W_MARK\"]"
  [[ $impl == torchrun ]] && expect=2
  for i in 0 1; do
    if [[ $impl == ddprun ]]; then
      start_agent "$run" "n$i" 60 "$DDPRUN" "$run/job.toml" --node-rank "$i"
    else
      torchrun_args 2 2 "$i" "$PORT" 1 "$mon"
      start_agent "$run" "n$i" 90 "${TR_ARGS[@]}" bash "$W_MARK"
    fi
  done
  local deadline=$((SECONDS + ROUND1_WAIT_S + 15))
  while (($(mark_times start 1 | wc -l) < expect)) && ((SECONDS < deadline)); do sleep 0.05; done
  local fail first last n
  fail=$(mark_times fail 0 | head -1)
  n=$(mark_times start 1 | wc -l)
  first=$(mark_times start 1 | sort -g | head -1)
  last=$(mark_times start 1 | sort -g | tail -1)
  if [[ -n "$fail" && -n "$first" ]]; then
    awk -v f="$fail" -v a="$first" -v b="$last" -v n="$n" 'BEGIN {printf "%.4f %.4f %d\n", a - f, b - f, n}' >>"$dir/times"
  else
    log "$impl: no restart seen within the bound; outputs in $run"
  fi
  kill_groups
  kill_workers "$BENCH_MARKS"
}

for impl in ddprun torchrun; do
  for mon in "" 0.1; do
    [[ $impl == ddprun && -n $mon ]] && continue
    name=$impl
    [[ -n $mon ]] && name="torchrun --monitor_interval $mon"
    dir=$(scratch "restart-$impl$mon")
    runs=$RUNS
    [[ $impl == torchrun ]] && runs=$TR_RUNS
    wait_quiet "restart: $name"
    for ((r = 0; r < runs; r++)); do one_run "$impl" "$mon" "$dir"; done
    if [[ $impl == ddprun ]]; then
      cmd="MODE=fail FAIL_ROUNDS=0 FAIL_RANK=3 FAIL_AFTER_S=1 SLEEP_S=30 timeout -k 5 60 $(rel "$DDPRUN") job.toml --node-rank 0|1 (job.toml: nnodes = 2, devices = 2, max_restarts = 1, backoff = \"0s\", command = [\"bash\", \"bench/w_mark.sh\"])"
    else
      torchrun_args 2 2 R P 1 "$mon"
      cmd="MODE=fail FAIL_ROUNDS=0 FAIL_RANK=3 FAIL_AFTER_S=1 SLEEP_S=30 timeout -k 5 90 ${TR_ARGS[*]} bash bench/w_mark.sh (R = 0 and 1; P = a free port)"
    fi
    nw=$(awk 'NR == 1 {print $3}' "$dir/times" 2>/dev/null)
    awk '{print $1}' "$dir/times" 2>/dev/null | record_stats restart-first "$S" \
      "failure -> first worker of the next round runs" "$name" s "$cmd"
    awk '{print $2}' "$dir/times" 2>/dev/null | record_stats restart-last "$S" \
      "failure -> last worker of the next round runs (${nw:-?} workers restarted)" "$name" s "$cmd"
  done
done
