#!/usr/bin/env bash
# Agent peak memory: VmHWM of the agent process itself (polled from /proc/<pid>/status every
# 10 ms until it exits; workers are not counted), for
#   1 node x 1 and 1 node x 8 workers sleeping 1 s;
#   2 nodes x 2 workers sleeping 1 s: node 0 (runs the coordinator too) and node 1;
# and `/usr/bin/time -f %M` (max RSS of the agent or any child it waited for) for 1 x 1 `true`.
# The agent of the log-throughput benchmark (8 x 200 MB of output) is measured in logs.sh.
# torchrun: --monitor_interval 0.1 (the interval does not change its memory, only its tail).
#   RUNS (ddprun, default 2), TR_RUNS (torchrun, default 1)
source "$(dirname "$0")/common.sh"
RUNS=${RUNS:-2}
TR_RUNS=${TR_RUNS:-1}
S=memory
export MODE=sleep SLEEP_S=1

one_run() {  # IMPL NNODES NPROC DIR
  local impl=$1 nn=$2 np=$3 dir=$4 run i pids=()
  run=$(mktemp -d "$dir/run.XXXX")
  new_marks "$run"
  free_port
  [[ $impl == ddprun ]] && ddprun_job "$run/job.toml" mem "$nn" "$np" "$PORT" 0 30s "[\"bash\", \"$W_MARK\"]"
  for ((i = 0; i < nn; i++)); do
    if [[ $impl == ddprun ]]; then
      start_agent "$run" "n$i" 60 "$DDPRUN" "$run/job.toml" --node-rank "$i"
    else
      torchrun_args "$nn" "$np" "$i" "$PORT" 0 0.1
      start_agent "$run" "n$i" 90 "${TR_ARGS[@]}" bash "$W_MARK"
    fi
  done
  for ((i = 0; i < nn; i++)); do
    pids+=("$(agent_pid "$run" "n$i")")
  done
  for ((i = 0; i < nn; i++)); do
    poll_hwm "${pids[$i]}" >"$run/hwm$i" &
  done
  wait_agents "$run" 90 $(for ((i = 0; i < nn; i++)); do echo "n$i"; done)
  wait  # the pollers
  for ((i = 0; i < nn; i++)); do
    awk '{printf "%.2f\n", $1 / 1024}' "$run/hwm$i" >>"$dir/hwm$i"
  done
  kill_groups
}

for impl in ddprun torchrun; do
  runs=$RUNS
  [[ $impl == torchrun ]] && runs=$TR_RUNS
  name=$impl
  wait_quiet "memory: $impl"
  for shape in "1 1" "1 8" "2 2"; do
    read -r nn np <<<"$shape"
    dir=$(scratch "mem-$impl")
    for ((r = 0; r < runs; r++)); do one_run "$impl" "$nn" "$np" "$dir"; done
    if [[ $impl == ddprun ]]; then
      cmd="MODE=sleep SLEEP_S=1 timeout -k 5 60 $(rel "$DDPRUN") job.toml --node-rank N (job.toml: nnodes = $nn, devices = $np, command = [\"bash\", \"bench/w_mark.sh\"]); VmHWM polled"
    else
      torchrun_args "$nn" "$np" N P 0 0.1
      cmd="MODE=sleep SLEEP_S=1 timeout -k 5 90 ${TR_ARGS[*]} bash bench/w_mark.sh; VmHWM polled"
    fi
    if ((nn == 1)); then
      record_stats "mem-$nn-$np" "$S" "agent VmHWM, $nn node x $np worker(s)" "$name" MiB "$cmd" <"$dir/hwm0"
    else
      record_stats "mem-$nn-$np-0" "$S" "agent VmHWM, $nn nodes x $np workers: node 0 (ddprun: with the coordinator; torchrun: hosts the TCPStore)" "$name" MiB "$cmd" <"$dir/hwm0"
      record_stats "mem-$nn-$np-1" "$S" "agent VmHWM, $nn nodes x $np workers: node 1" "$name" MiB "$cmd" <"$dir/hwm1"
    fi
  done

  # /usr/bin/time: max RSS of the agent or of any process it waited for.
  dir=$(scratch "memtime-$impl")
  cd "$dir"
  : >"$dir/kb"
  for ((r = 0; r < runs; r++)); do
    free_port
    if [[ $impl == ddprun ]]; then
      ddprun_job "$dir/job.toml" memt 1 1 "$PORT" 0 30s '["true"]'
      /usr/bin/time -f %M -a -o "$dir/kb" timeout -k 5 60 "$DDPRUN" job.toml --node-rank 0 >/dev/null 2>&1 || true
      cmd="/usr/bin/time -f %M timeout -k 5 60 $(rel "$DDPRUN") job.toml --node-rank 0 (nnodes = 1, devices = 1, command = [\"true\"])"
    else
      torchrun_args 1 1 0 "$PORT" 0 0.1
      /usr/bin/time -f %M -a -o "$dir/kb" timeout -k 5 90 "${TR_ARGS[@]}" true >/dev/null 2>&1 || true
      cmd="/usr/bin/time -f %M timeout -k 5 90 ${TR_ARGS[*]} true"
    fi
  done
  cd "$REPO"
  awk '{printf "%.2f\n", $1 / 1024}' "$dir/kb" | record_stats mem-time "$S" \
    "\`/usr/bin/time\` max RSS, 1 node x 1 \`true\`" "$name" MiB "$cmd"
done
