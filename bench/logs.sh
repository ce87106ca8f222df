#!/usr/bin/env bash
# Log throughput: 8 workers on one node, each writing LOG_MB MB (default 200 MB, 10^6 bytes) of
# 100-byte lines to stdout (`yes LINE | head -c BYTES`), end to end (hyperfine):
#   baseline      the same 8 writers straight to 8 files, no launcher;
#   ddprun        per-rank files + prefixed console (logs.console = "all"), stdout to /dev/null;
#   ddprun        per-rank files only (logs.console = "none");
#   torchrun      --redirects 1 --tee 1 (per-rank files + "[default0]:" prefixed console, stdout
#                 to /dev/null). On Python 3.11 "1" parses (only "0" and "3" hit the IntFlag bug).
# After the last run each set checks that the files hold every byte. Also records the ddprun
# agent's peak memory (VmHWM) while it relays 8 x LOG_MB MB.
# torchrun relays through Python tail threads, about 25x slower, so it writes TR_LOG_MB MB per
# worker (default 50) to stay within the time budget; compare the MB/s rows.
#   RUNS (default 3), TR_RUNS (torchrun, default 1)
source "$(dirname "$0")/common.sh"
RUNS=${RUNS:-3}
TR_RUNS=${TR_RUNS:-1}
LOG_MB=${LOG_MB:-200}
TR_LOG_MB=${TR_LOG_MB:-50}
BYTES=$((LOG_MB * 1000000))
S=logs
dir=$(scratch logs)
cd "$dir"
export LOG_BYTES=$BYTES
W_LOG=$BENCH_DIR/w_log.sh
label="8 workers x $LOG_MB MB of 100-byte lines"

# rate ID IMPL MB : records the aggregate throughput (8 x MB / median time) of the last hyperfine
rate() {
  "$PYTHON" - "$HF_JSON" "$3" <<'PY' | record_stats "logs-rate" "$S" "aggregate throughput, 8 writers (MB/s)" "$2" MB/s "$1"
import json, statistics, sys
times = json.load(open(sys.argv[1]))["results"][0]["times"]
for t in times:
    print(8 * float(sys.argv[2]) / t)
PY
}
check_bytes() {  # WHAT FILES... : logs a warning unless the files hold 8 x BYTES
  local what=$1 total
  shift
  total=$(cat "$@" 2>/dev/null | wc -c)
  if ((total != 8 * BYTES)); then
    log "$what: files hold $total bytes, expected $((8 * BYTES))"
    record "logs-lost" "$S" "$label: bytes missing from the per-rank files" "$what" "$((8 * BYTES - total))" - - 1 bytes "$what"
  fi
}

# baseline
wait_quiet "logs: baseline"
base="for r in 0 1 2 3 4 5 6 7; do bash $W_LOG > out.\$r & done; wait"
hf --runs "$RUNS" --prepare "rm -f out.*" "$base"
record_hyperfine logs "$S" "$label" "straight to files (no launcher)" "$HF_JSON" \
  "LOG_BYTES=$BYTES hyperfine --runs $RUNS --prepare 'rm -f out.*' \"${base/$W_LOG/bench/w_log.sh}\""
rate "see the row above" "straight to files (no launcher)" "$LOG_MB"
check_bytes "straight to files" out.*
rm -f out.*

# ddprun, console all / none
for console in all none; do
  free_port
  ddprun_job "$dir/job-$console.toml" logs 1 8 "$PORT" 0 60s "[\"bash\", \"$W_LOG\"]" \
    "[logs]
console = \"$console\""
  wait_quiet "logs: ddprun console=$console"
  cmd="timeout -k 5 300 $DDPRUN job-$console.toml --node-rank 0 > /dev/null"
  hf --runs "$RUNS" --prepare "rm -rf logs" "$cmd"
  record_hyperfine logs "$S" "$label" "ddprun, logs.console = \"$console\"" "$HF_JSON" \
    "LOG_BYTES=$BYTES hyperfine --runs $RUNS --prepare 'rm -rf logs' \"timeout -k 5 300 $(rel "$DDPRUN") job-$console.toml --node-rank 0 > /dev/null\" (job: nnodes = 1, devices = 8, command = [\"bash\", \"bench/w_log.sh\"], logs.console = \"$console\")"
  rate "see the row above" "ddprun, logs.console = \"$console\"" "$LOG_MB"
  check_bytes "ddprun console=$console" logs/logs/attempt-0/rank-*.log
  rm -rf logs
done

# ddprun agent memory while it relays the output (console = "all")
free_port
ddprun_job "$dir/job-mem.toml" logs 1 8 "$PORT" 0 60s "[\"bash\", \"$W_LOG\"]"
start_agent "$dir" logmem 300 "$DDPRUN" "$dir/job-mem.toml" --node-rank 0
poll_hwm "$(agent_pid "$dir" logmem)" | awk '{printf "%.2f\n", $1 / 1024}' |
  record_stats logs-mem "$S" "agent VmHWM while relaying 8 x $LOG_MB MB (console = \"all\")" ddprun MiB \
    "timeout -k 5 300 $(rel "$DDPRUN") job.toml --node-rank 0 > /dev/null; VmHWM polled"
wait_agents "$dir" 300 logmem
rm -rf logs

# torchrun --redirects 1 --tee 1
BYTES=$((TR_LOG_MB * 1000000))
export LOG_BYTES=$BYTES
free_port
wait_quiet "logs: torchrun --tee 1"
tr=("$PYTHON" -m torch.distributed.run --redirects 1 --tee 1 --monitor_interval 0.1 --log_dir tlogs
  --nnodes 1 --nproc_per_node 8 --node_rank 0 --master_addr 127.0.0.1 --master_port "$PORT"
  --max_restarts 0 --no_python bash "$W_LOG")
cmd="timeout -k 5 300 ${tr[*]} > /dev/null"
hf --runs "$TR_RUNS" --prepare "rm -rf tlogs" "$cmd"
record_hyperfine logs-tr "$S" "8 workers x $TR_LOG_MB MB of 100-byte lines" "torchrun --redirects 1 --tee 1" "$HF_JSON" \
  "LOG_BYTES=$BYTES hyperfine --runs $TR_RUNS --prepare 'rm -rf tlogs' \"${cmd/$W_LOG/bench/w_log.sh}\""
rate "see the row above" "torchrun --redirects 1 --tee 1" "$TR_LOG_MB"
check_bytes "torchrun --tee 1" tlogs/*/attempt_0/*/stdout.log
rm -rf tlogs
