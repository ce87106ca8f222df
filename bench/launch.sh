#!/usr/bin/env bash
# Launch: one node with 1 and 8 workers running `true`, from the launcher's start to its exit,
# measured with hyperfine. ddprun against torchrun with its default monitor interval (5 s) and
# with --monitor_interval 0.1. Context rows: the bare process costs on this machine.
#   RUNS (ddprun, default 20), TR_RUNS (torchrun default interval, 2), TR_FAST_RUNS (MON=0.1, 5)
source "$(dirname "$0")/common.sh"
RUNS=${RUNS:-20}
TR_RUNS=${TR_RUNS:-2}
TR_FAST_RUNS=${TR_FAST_RUNS:-5}
S=launch
dir=$(scratch launch)
cd "$dir"  # the job files and their logs/ live here

wait_quiet "launch: context"
for c in "true" "sh -c 'true & true & true & true & true & true & true & true & wait'" \
  "$PYTHON -c pass" "$PYTHON -c 'import torch'"; do
  n=$RUNS
  [[ "$c" == *torch* ]] && n=2
  hf -N --runs "$n" --warmup 1 "$c"
  record_hyperfine "ctx" "$S" "context: \`$c\`" context "$HF_JSON" "hyperfine -N --runs $n --warmup 1 \"$c\""
done

for n in 1 8; do
  free_port
  ddprun_job "$dir/job$n.toml" launch 1 "$n" "$PORT" 0 30s '["true"]'
  cmd="timeout -k 5 30 $(rel "$DDPRUN") job$n.toml --node-rank 0"
  wait_quiet "launch: ddprun x$n"
  hf -N --runs "$RUNS" --warmup 2 "timeout -k 5 30 $DDPRUN job$n.toml --node-rank 0"
  record_hyperfine "launch-$n" "$S" "1 node x $n, \`true\`" ddprun "$HF_JSON" \
    "hyperfine -N --runs $RUNS --warmup 2 \"$cmd\" (job$n.toml: nnodes = 1, devices = $n, command = [\"true\"])"

  for mon in "" 0.1; do
    free_port
    torchrun_args 1 "$n" 0 "$PORT" 0 "$mon"
    cmd="timeout -k 5 120 ${TR_ARGS[*]} true"
    runs=$TR_RUNS
    impl="torchrun"
    if [[ -n "$mon" ]]; then runs=$TR_FAST_RUNS; impl="torchrun --monitor_interval $mon"; fi
    wait_quiet "launch: $impl x$n"
    hf -N --runs "$runs" --warmup 1 "$cmd"
    record_hyperfine "launch-$n" "$S" "1 node x $n, \`true\`" "$impl" "$HF_JSON" \
      "hyperfine -N --runs $runs --warmup 1 \"$cmd\""
  done
done
