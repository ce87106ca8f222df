# Shared helpers for the ddprun-vs-torchrun benchmarks. Sourced, not run.
#
# Everything runs on 127.0.0.1. Every process a script starts is bounded with `timeout -k 5`,
# lives in its own process group (GNU timeout makes itself a group leader), and is killed by
# that group id (and worker pids the workers record) when the script exits. Nothing is killed
# by name.
#
# Results go to $BENCH_OUT/results.tsv, one row per figure:
#   id  section  label  impl  median  min  max  runs  unit  command
# bench/render.py turns them into the tables of docs/performance.md.

set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$BENCH_DIR/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$REPO/build/bench}
DDPRUN=${DDPRUN:-$BUILD_DIR/cli/ddprun}
PYTHON=${PYTHON:-/usr/bin/python3}
# torchrun 1.13 on Python 3.11 dies in Std.from_str("0") unless --redirects/--tee are given a
# value it can parse; 9:1 redirects a local rank that does not exist (see the torchrun baseline).
TORCHRUN=("$PYTHON" -m torch.distributed.run --redirects 9:1 --tee 9:1)
BENCH_OUT=${BENCH_OUT:-$REPO/bench/out}
RESULTS=$BENCH_OUT/results.tsv
W_MARK=$BENCH_DIR/w_mark.sh
mkdir -p "$BENCH_OUT"

# Repo-relative form of a path, for the commands written into the report.
rel() { local p=$1; printf '%s' "${p#"$REPO"/}"; }

log() { printf '[bench %s] %s\n' "$(date +%T)" "$*" >&2; }

# A scratch directory for one scenario, removed at exit.
SCRATCH_ROOT=$(mktemp -d "${TMPDIR:-/tmp}/ddprun-bench.XXXXXX")
scratch() { mktemp -d "$SCRATCH_ROOT/$1.XXXX"; }

# ---- ports -------------------------------------------------------------------------------
# Ports from BENCH_PORT_BASE up, skipping any that something listens on.
BENCH_PORT_BASE=${BENCH_PORT_BASE:-$((29600 + RANDOM % 2000))}
_PORT_NEXT=$BENCH_PORT_BASE
free_port() {
  local p=$_PORT_NEXT
  while ss -Htln "sport = :$p" 2>/dev/null | grep -q .; do p=$((p + 1)); done
  _PORT_NEXT=$((p + 1))
  PORT=$p
}

# ---- quiet machine -----------------------------------------------------------------------
# Waits (at most QUIET_MAX_S) until the CPUs are at least QUIET_PCT% idle over 1 s; records
# the idle share seen in $BENCH_OUT/quiet.log. Other work may share the machine.
QUIET_PCT=${QUIET_PCT:-85}
QUIET_MAX_S=${QUIET_MAX_S:-5}
cpu_idle_pct() {
  local a b
  read -r -a a < <(grep '^cpu ' /proc/stat)
  sleep 1
  read -r -a b < <(grep '^cpu ' /proc/stat)
  local total=0 i
  for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
  local idle=$((b[4] - a[4] + b[5] - a[5]))
  echo $((total > 0 ? 100 * idle / total : 100))
}
wait_quiet() {
  local what=$1 start=$SECONDS idle
  while :; do
    idle=$(cpu_idle_pct)
    if ((idle >= QUIET_PCT || SECONDS - start >= QUIET_MAX_S)); then break; fi
  done
  printf '%s\t%s%% idle\tload %s\n' "$what" "$idle" "$(cut -d' ' -f1 /proc/loadavg)" >>"$BENCH_OUT/quiet.log"
  log "$what: CPUs ${idle}% idle"
}

# ---- statistics and results --------------------------------------------------------------
# stats < numbers  ->  "median min max n"
stats() {
  sort -g | awk '{v[NR]=$1} END {
    if (NR == 0) { print "- - - 0"; exit }
    m = (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2
    printf "%.4f %.4f %.4f %d\n", m, v[1], v[NR], NR }'
}
# record ID SECTION LABEL IMPL MEDIAN MIN MAX RUNS UNIT COMMAND
record() {
  local IFS=$'\t'
  printf '%s\n' "$*" >>"$RESULTS"
}
# record_stats ID SECTION LABEL IMPL UNIT COMMAND < numbers
record_stats() {
  local m mn mx n
  read -r m mn mx n < <(stats)
  record "$1" "$2" "$3" "$4" "$m" "$mn" "$mx" "$n" "$5" "$6"
}
# Records hyperfine's JSON (one command): times in seconds.
record_hyperfine() {  # ID SECTION LABEL IMPL JSON COMMAND
  "$PYTHON" - "$5" <<'EOF' | record_stats "$1" "$2" "$3" "$4" s "$6"
import json, sys
for t in json.load(open(sys.argv[1]))["results"][0]["times"]:
    print(t)
EOF
}
# hyperfine with our defaults; extra arguments go first. Writes JSON to $HF_JSON.
hf() {
  HF_JSON=$(mktemp "$SCRATCH_ROOT/hf.XXXX.json")
  hyperfine --style basic --export-json "$HF_JSON" "$@" >&2
}

# ---- processes ---------------------------------------------------------------------------
AGENT_GROUPS=()
# start_agent DIR NAME BOUND_S CMD... : runs CMD under `timeout -k 5 BOUND_S` in the
# background, output in DIR/NAME.out, "exit-code epoch-seconds" in DIR/NAME.rc when it exits.
start_agent() {
  local dir=$1 name=$2 bound=$3
  shift 3
  (
    timeout -k 5 "$bound" "$@" </dev/null >"$dir/$name.out" 2>&1 &
    t=$!
    echo "$t" >"$dir/$name.pgid"
    wait "$t" && rc=0 || rc=$?
    echo "$rc $EPOCHREALTIME" >"$dir/$name.rc"
  ) 2>/dev/null &
  # The group id is timeout's pid; wait until the subshell has written it.
  local i
  for ((i = 0; i < 500; i++)); do
    [[ -s "$dir/$name.pgid" ]] && break
    sleep 0.002
  done
  AGENT_GROUPS+=("$(cat "$dir/$name.pgid")")
}
# wait_agents DIR BOUND_S NAME... : waits until each NAME.rc exists (at most BOUND_S).
wait_agents() {
  local dir=$1 bound=$2
  shift 2
  local deadline=$((SECONDS + bound)) n
  for n in "$@"; do
    while [[ ! -s "$dir/$n.rc" ]] && ((SECONDS < deadline)); do sleep 0.02; done
  done
}
# Kills every agent group started so far and any worker the workers recorded.
kill_groups() {
  local g
  for g in "${AGENT_GROUPS[@]}"; do kill -TERM -- "-$g" 2>/dev/null || true; done
  sleep 0.2
  for g in "${AGENT_GROUPS[@]}"; do kill -KILL -- "-$g" 2>/dev/null || true; done
  AGENT_GROUPS=()
}
# Worker pids recorded by w_mark.sh that are still alive (and still are w_mark workers).
live_workers() {  # MARKS_FILE
  local p
  [[ -f "$1.pids" ]] || return 0
  for p in $(cat "$1.pids"); do
    if [[ -r /proc/$p/cmdline ]] && tr '\0' ' ' <"/proc/$p/cmdline" | grep -q 'w_mark\|sleep'; then
      echo "$p"
    fi
  done
}
kill_workers() {  # MARKS_FILE
  local p
  for p in $(live_workers "$1"); do kill -KILL "$p" 2>/dev/null || true; done
}
_MARK_FILES=()
cleanup() {
  kill_groups
  local f
  for f in "${_MARK_FILES[@]}"; do kill_workers "$f"; done
  rm -rf "$SCRATCH_ROOT"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- job descriptions --------------------------------------------------------------------
# ddprun_job FILE NAME NNODES NPROC PORT MAX_RESTARTS RENDEZVOUS COMMAND_TOML [EXTRA_TOML]
ddprun_job() {
  cat >"$1" <<EOF
version = 1
[job]
name = "$2"
command = $8
[cluster]
nnodes = $3
master_addr = "127.0.0.1"
master_port = $5
[trainer]
accelerator = "cpu"
devices = $4
num_nodes = $3
[restart]
max_restarts = $6
backoff = "0s"
[timeouts]
rendezvous = "$7"
stop_grace = "5s"
${9:-}
EOF
}
# torchrun_args NNODES NPROC NODE_RANK PORT MAX_RESTARTS MONITOR(or "") : sets TR_ARGS
torchrun_args() {
  TR_ARGS=("${TORCHRUN[@]}")
  [[ -n "$6" ]] && TR_ARGS+=(--monitor_interval "$6")
  TR_ARGS+=(--nnodes "$1" --nproc_per_node "$2" --node_rank "$3" --master_addr 127.0.0.1
    --master_port "$4" --max_restarts "$5" --no_python)
}
# A new marks file for w_mark.sh workers (exported as BENCH_MARKS).
new_marks() {
  BENCH_MARKS="$1/marks"
  : >"$BENCH_MARKS"
  export BENCH_MARKS
  _MARK_FILES+=("$BENCH_MARKS")
}
# mark_times KIND [ROUND] : epoch times of the marks of that kind (and round).
mark_times() {
  awk -v k="$1" -v r="${2:-}" '$1 == k && (r == "" || $3 == r) {print $4}' "$BENCH_MARKS"
}
# Polls the VmHWM of PID until it exits; prints the last value seen, in kB.
poll_hwm() {
  local pid=$1 kb=0 v
  while [[ -r /proc/$pid/status ]]; do
    v=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    [[ -n "$v" ]] && kb=$v
    sleep 0.01
  done
  echo "$kb"
}
# The pid of timeout's child (the agent itself) for the group started as NAME.
agent_pid() {  # DIR NAME
  local t i c
  t=$(cat "$1/$2.pgid")
  for ((i = 0; i < 1000; i++)); do
    c=$(cat "/proc/$t/task/$t/children" 2>/dev/null || true)
    [[ -n "$c" ]] && { echo "${c%% *}"; return; }
    sleep 0.002
  done
}
