#!/usr/bin/env bash
# Failure to full stop: 2 nodes x 2 workers (bench/w_mark.sh, MODE=fail): rank 3 exits 1 after
# 1 s, the others sleep 30 s. Measured from the failing worker's "fail" mark (written just
# before it exits) until every worker on every node has stopped ("term"/"done" marks, and no
# worker pid left alive) and every agent has exited; each agent's exit code is recorded.
# ddprun: max_restarts = 0. torchrun: --max_restarts 0, default monitor interval.
#   RUNS (ddprun, default 3), TR_RUNS (torchrun, default 1; each takes about 35 s)
source "$(dirname "$0")/common.sh"
RUNS=${RUNS:-3}
TR_RUNS=${TR_RUNS:-1}
S=failure
export MODE=fail FAIL_RANK=3 FAIL_AFTER_S=1 SLEEP_S=30

one_run() {  # IMPL DIR
  local impl=$1 dir=$2 run i
  run=$(mktemp -d "$dir/run.XXXX")
  new_marks "$run"
  free_port
  [[ $impl == ddprun ]] && ddprun_job "$run/job.toml" fail 2 2 "$PORT" 0 30s "[\"bash\", \"$W_MARK\"]"
  for i in 0 1; do
    if [[ $impl == ddprun ]]; then
      start_agent "$run" "n$i" 60 "$DDPRUN" "$run/job.toml" --node-rank "$i"
    else
      torchrun_args 2 2 "$i" "$PORT" 0 ""
      start_agent "$run" "n$i" 90 "${TR_ARGS[@]}" bash "$W_MARK"
    fi
  done
  wait_agents "$run" 90 n0 n1
  local fail alive stop e0 e1 rc0 rc1
  fail=$(mark_times fail 0 | head -1)
  alive=$(live_workers "$BENCH_MARKS" | wc -l)
  stop=$( { mark_times term; mark_times done; } | sort -g | tail -1)
  read -r rc0 e0 <"$run/n0.rc"
  read -r rc1 e1 <"$run/n1.rc"
  if [[ -z "$fail" ]]; then
    log "$impl: no failure mark; outputs in $run"
    kill_groups
    return
  fi
  # full stop = the later of the last worker stop and the last agent exit
  awk -v f="$fail" -v s="${stop:-$fail}" -v a="$e0" -v b="$e1" 'BEGIN {
    m = s; if (a > m) m = a; if (b > m) m = b
    printf "%.4f %.4f %.4f %.4f\n", m - f, a - f, b - f, s - f }' >>"$dir/times"
  echo "$rc0 $rc1 $alive" >>"$dir/codes"
  cp "$run/n0.out" "$dir/n0.out"
  cp "$run/n1.out" "$dir/n1.out"
  kill_groups
}

for impl in ddprun torchrun; do
  dir=$(scratch "fail-$impl")
  runs=$RUNS
  [[ $impl == torchrun ]] && runs=$TR_RUNS
  wait_quiet "failure: $impl"
  for ((r = 0; r < runs; r++)); do one_run "$impl" "$dir"; done
  if [[ $impl == ddprun ]]; then
    cmd="MODE=fail FAIL_RANK=3 FAIL_AFTER_S=1 SLEEP_S=30 timeout -k 5 60 $(rel "$DDPRUN") job.toml --node-rank 0|1 (job.toml: nnodes = 2, devices = 2, max_restarts = 0, command = [\"bash\", \"bench/w_mark.sh\"])"
  else
    torchrun_args 2 2 R P 0 ""
    cmd="MODE=fail FAIL_RANK=3 FAIL_AFTER_S=1 SLEEP_S=30 timeout -k 5 90 ${TR_ARGS[*]} bash bench/w_mark.sh (R = 0 and 1, started together; P = a free port)"
  fi
  label="2 nodes x 2, rank 3 exits 1 at 1 s"
  awk '{print $1}' "$dir/times" | record_stats fail-full "$S" "$label: failure -> every worker stopped and every agent exited" "$impl" s "$cmd"
  awk '{print $2}' "$dir/times" | record_stats fail-n0 "$S" "$label: failure -> node 0 agent exited" "$impl" s "$cmd"
  awk '{print $3}' "$dir/times" | record_stats fail-n1 "$S" "$label: failure -> node 1 agent exited" "$impl" s "$cmd"
  awk '{print $4}' "$dir/times" | record_stats fail-workers "$S" "$label: failure -> last worker stopped" "$impl" s "$cmd"
  codes=$(awk '{printf "%s%s / %s", (NR > 1 ? "; " : ""), $1, $2}' "$dir/codes")
  alive=$(awk '{s += $3} END {print s + 0}' "$dir/codes")
  record fail-rc "$S" "$label: agent exit codes, node 0 / node 1 (per run)" "$impl" "$codes" - - \
    "$(wc -l <"$dir/codes")" text "$cmd"
  record fail-alive "$S" "$label: workers still alive after both agents exited (all runs)" "$impl" "$alive" - - \
    "$(wc -l <"$dir/codes")" count "$cmd"
  # What each agent printed, for the report.
  for n in n0 n1; do
    cp "$dir/$n.out" "$BENCH_OUT/failure-$impl-$n.out" 2>/dev/null || true
  done
done
