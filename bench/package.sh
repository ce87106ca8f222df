#!/usr/bin/env bash
# The portable binary (scripts/package.sh) beside the dynamic one of the same optimisation, with
# torchrun as the yardstick, in one run (docs/performance.md, "The portable binary"):
#   launch:   1 node x 8 workers running `true`, the launcher's start to its exit (hyperfine)
#   simulate: `ddprun --simulate bench/sim_scale.toml --nodes 16384` (rendezvous, a failure, a
#             restart, success), wall time (hyperfine)
#   PORTABLE (default build/portable/cli/ddprun), DYNAMIC (default build/release/cli/ddprun),
#   RUNS (launch, default 20), SIM_RUNS (default 3), TR_RUNS (torchrun, default 5)
source "$(dirname "$0")/common.sh"
RUNS=${RUNS:-20}
SIM_RUNS=${SIM_RUNS:-3}
TR_RUNS=${TR_RUNS:-5}
PORTABLE=$(realpath "${PORTABLE:-build/portable/cli/ddprun}")
DYNAMIC=$(realpath "${DYNAMIC:-build/release/cli/ddprun}")
S=package
dir=$(scratch package)
cd "$dir"

free_port
ddprun_job "$dir/job8.toml" launch 1 8 "$PORT" 0 30s '["true"]'
for impl in dynamic portable; do
  binary=$DYNAMIC
  [[ $impl == portable ]] && binary=$PORTABLE
  wait_quiet "package: launch, $impl"
  hf -N --runs "$RUNS" --warmup 2 "timeout -k 5 30 $binary job8.toml --node-rank 0"
  record_hyperfine "package-launch" "$S" "1 node x 8, \`true\`, start to exit" "ddprun ($impl)" "$HF_JSON" \
    "hyperfine -N --runs $RUNS --warmup 2 \"timeout -k 5 30 $(rel "$binary") job8.toml --node-rank 0\" (nnodes = 1, devices = 8, command = [\"true\"])"
done
free_port
torchrun_args 1 8 0 "$PORT" 0 0.1
wait_quiet "package: launch, torchrun"
hf -N --runs "$TR_RUNS" --warmup 1 "timeout -k 5 120 ${TR_ARGS[*]} true"
record_hyperfine "package-launch" "$S" "1 node x 8, \`true\`, start to exit" "torchrun --monitor_interval 0.1" "$HF_JSON" \
  "hyperfine -N --runs $TR_RUNS --warmup 1 \"${TR_ARGS[*]} true\""

for impl in dynamic portable; do
  binary=$DYNAMIC
  [[ $impl == portable ]] && binary=$PORTABLE
  wait_quiet "package: simulate 16384, $impl"
  hf -N --runs "$SIM_RUNS" --warmup 1 "$binary --simulate $BENCH_DIR/sim_scale.toml --nodes 16384"
  record_hyperfine "package-sim" "$S" "\`ddprun --simulate bench/sim_scale.toml --nodes 16384\`" "ddprun ($impl)" "$HF_JSON" \
    "hyperfine -N --runs $SIM_RUNS --warmup 1 \"$(rel "$binary") --simulate bench/sim_scale.toml --nodes 16384\""
done
log "results in $RESULTS"
