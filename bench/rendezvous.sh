#!/usr/bin/env bash
# Rendezvous: N agents (N = 2 and 8, one worker each) on 127.0.0.1, started back to back;
# time from the launch of the FIRST agent until every worker runs (the last worker's "start"
# mark, written by bench/w_mark.sh with $EPOCHREALTIME). Also reported from the launch of the
# LAST agent. torchrun: static rendezvous (node 0 hosts the TCPStore), --monitor_interval 0.1
# (the interval only matters after the workers start; it shortens each run's tail).
#   RUNS (ddprun, default 5), TR_RUNS (torchrun, default 2)
source "$(dirname "$0")/common.sh"
RUNS=${RUNS:-5}
TR_RUNS=${TR_RUNS:-2}
S=rendezvous

# one_run IMPL N DIR : appends "from_first from_last" seconds to DIR/times
one_run() {
  local impl=$1 n=$2 dir=$3 run i
  run=$(mktemp -d "$dir/run.XXXX")
  new_marks "$run"
  export MODE=true
  free_port
  [[ $impl == ddprun ]] && ddprun_job "$run/job.toml" rdzv "$n" 1 "$PORT" 0 60s "[\"bash\", \"$W_MARK\"]"
  local t_first t_last names=()
  t_first=$EPOCHREALTIME
  for ((i = 0; i < n; i++)); do
    t_last=$EPOCHREALTIME
    if [[ $impl == ddprun ]]; then
      start_agent "$run" "a$i" 60 "$DDPRUN" "$run/job.toml" --node-rank "$i"
    else
      torchrun_args "$n" 1 "$i" "$PORT" 0 0.1
      start_agent "$run" "a$i" 120 "${TR_ARGS[@]}" bash "$W_MARK"
    fi
    names+=("a$i")
  done
  wait_agents "$run" 120 "${names[@]}"
  local started last
  started=$(mark_times start | wc -l)
  last=$(mark_times start | sort -g | tail -1)
  if ((started != n)); then
    log "$impl x$n: only $started of $n workers started; outputs in $run"
    cat "$run"/a0.out >&2
  else
    awk -v a="$t_first" -v b="$t_last" -v l="$last" 'BEGIN {printf "%.4f %.4f\n", l - a, l - b}' >>"$dir/times"
  fi
  kill_groups
}

for n in 2 8; do
  for impl in ddprun torchrun; do
    dir=$(scratch "rdzv-$impl-$n")
    runs=$RUNS
    [[ $impl == torchrun ]] && runs=$TR_RUNS
    wait_quiet "rendezvous: $impl x$n agents"
    for ((r = 0; r < runs; r++)); do one_run "$impl" "$n" "$dir"; done
    if [[ $impl == ddprun ]]; then
      cmd="for i in 0..$((n - 1)): timeout -k 5 60 $(rel "$DDPRUN") job.toml --node-rank \$i & (job.toml: nnodes = $n, devices = 1, command = [\"bash\", \"bench/w_mark.sh\"], MODE=true)"
    else
      torchrun_args "$n" 1 I P 0 0.1
      cmd="for i in 0..$((n - 1)): MODE=true timeout -k 5 120 ${TR_ARGS[*]} bash bench/w_mark.sh &  (I = \$i, P = a free port)"
      cmd=${cmd/--node_rank I/--node_rank \$i}
    fi
    awk '{print $1}' "$dir/times" 2>/dev/null | record_stats "rdzv-$n-first" "$S" \
      "$n agents x 1 worker: first agent launched -> every worker runs" "$impl" s "$cmd"
    awk '{print $2}' "$dir/times" 2>/dev/null | record_stats "rdzv-$n-last" "$S" \
      "$n agents x 1 worker: last agent launched -> every worker runs" "$impl" s "$cmd"
  done
done
