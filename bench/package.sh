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
# Both binaries through one measurement: ID, WHAT (the table's row), RUNS, WARMUP, the command
# with @BIN@ for the binary, the command as the table shows it, and a NOTE after it (optional).
measure_both() {
  local id=$1 what=$2 runs=$3 warmup=$4 args=$5 shown_args=$6 note=${7:-} impl binary
  for impl in dynamic portable; do
    binary=$DYNAMIC
    [[ $impl == portable ]] && binary=$PORTABLE
    wait_quiet "package: $id, $impl"
    hf -N --runs "$runs" --warmup "$warmup" "${args/@BIN@/$binary}"
    record_hyperfine "$id" "$S" "$what" "ddprun ($impl)" "$HF_JSON" \
      "hyperfine -N --runs $runs --warmup $warmup \"${shown_args/@BIN@/$(rel "$binary")}\"$note"
  done
}

measure_both package-launch "1 node x 8, \`true\`, start to exit" "$RUNS" 2 \
  "timeout -k 5 30 @BIN@ job8.toml --node-rank 0" \
  "timeout -k 5 30 @BIN@ job8.toml --node-rank 0" ' (nnodes = 1, devices = 8, command = ["true"])'
free_port
torchrun_args 1 8 0 "$PORT" 0 0.1
wait_quiet "package: launch, torchrun"
hf -N --runs "$TR_RUNS" --warmup 1 "timeout -k 5 120 ${TR_ARGS[*]} true"
record_hyperfine "package-launch" "$S" "1 node x 8, \`true\`, start to exit" "torchrun --monitor_interval 0.1" "$HF_JSON" \
  "hyperfine -N --runs $TR_RUNS --warmup 1 \"${TR_ARGS[*]} true\""

measure_both package-sim "\`ddprun --simulate bench/sim_scale.toml --nodes 16384\`" "$SIM_RUNS" 1 \
  "@BIN@ --simulate $BENCH_DIR/sim_scale.toml --nodes 16384" "@BIN@ --simulate bench/sim_scale.toml --nodes 16384"
log "results in $RESULTS"
