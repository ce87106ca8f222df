#!/usr/bin/env bash
# A rack of real agents on the namespace bed (issue 39.4), ddprun and torchrun side by side in
# one run: HOSTS hosts (default 64), each a network, UTS and mount namespace with its own name,
# a stock Debian /etc/hosts (its own name on 127.0.1.1), a management NIC listed first and a
# data NIC on a shared bridge (tests/e2e/testbed.h), one agent and one worker per host.
# ddprun: the job file lists the hosts by name and nothing else. torchrun: c10d rendezvous at
# gpu-01, on the first TR_HOSTS hosts (default 32: each torchrun agent holds about 240 MB, and
# the machine has 24 GiB). Figures per run (tests/e2e/rack_test.cc measures them):
#   first agent launched -> every worker started (its start mark, bash's $EPOCHREALTIME)
#   node 0's agent: resident and peak memory, open descriptors, while every worker runs
#   console lines: node 0's, and the most of any other node
# Needs root (the bed). RUNS (default 3).
source "$(dirname "$0")/common.sh"
RUNS=${RUNS:-3}
HOSTS=${HOSTS:-64}
TR_HOSTS=${TR_HOSTS:-32}
S=rack
RACK_TEST=${RACK_TEST:-$BUILD_DIR/tests/e2e/rack_e2e_test}
[[ -x $RACK_TEST ]] || { log "no $RACK_TEST: build the tests (cmake --build $BUILD_DIR)"; exit 1; }
[[ $(id -u) == 0 ]] || { log "the namespace bed needs root"; exit 1; }

dir=$(scratch rack)
for ((r = 0; r < RUNS; r++)); do
  wait_quiet "rack: $HOSTS ddprun agents, $TR_HOSTS torchrun agents (run $((r + 1)) of $RUNS)"
  RACK_HOSTS=$HOSTS RACK_TORCHRUN=$TR_HOSTS DDPRUN_REQUIRE=testbed,torch \
    timeout -k 5 900 "$RACK_TEST" --gtest_output="json:$dir/run-$r.json" >"$dir/run-$r.out" 2>&1 ||
    { log "run $r failed; see $dir/run-$r.out"; tail -20 "$dir/run-$r.out" >&2; exit 1; }
done

# The table of docs/performance.md ("A rack on the namespace bed"): median (min-max) of the runs.
"$PYTHON" - "$dir" "$HOSTS" "$TR_HOSTS" <<'EOF'
import glob, json, statistics, sys
folder, hosts, tr_hosts = sys.argv[1], sys.argv[2], sys.argv[3]
runs = []
for path in sorted(glob.glob(folder + "/run-*.json")):
    test = json.load(open(path))["testsuites"][0]["testsuite"][0]
    runs.append({k: float(v) for k, v in test.items() if k.startswith(("ddprun_", "torchrun_"))})
def cell(key, scale=1.0, digits=0):
    values = [r[key] / scale for r in runs if key in r]
    if not values:
        return "-"
    f = lambda v: f"{v:.{digits}f}"
    return f"{f(statistics.median(values))} ({f(min(values))}-{f(max(values))})"
def median(key):
    return statistics.median(r[key] for r in runs)
print(f"| figure | ddprun, {hosts} hosts | torchrun c10d, {tr_hosts} hosts | ratio |")
print("|---|---|---|---|")
ratio = median("torchrun_all_started_ms") / median("ddprun_all_started_ms")
print(f"| first agent launched -> every worker started (s) | {cell('ddprun_all_started_ms', 1000, 2)} | "
      f"{cell('torchrun_all_started_ms', 1000, 2)} | torchrun {ratio:.0f}x longer with half the hosts |")
ratio = median("torchrun_node0_peak_kb") / median("ddprun_node0_peak_kb")
print(f"| node 0's agent, peak resident memory (MiB) | {cell('ddprun_node0_peak_kb', 1024, 1)} | "
      f"{cell('torchrun_node0_peak_kb', 1024, 1)} | torchrun {ratio:.0f}x |")
print(f"| node 0's agent, open descriptors while every worker runs | {cell('ddprun_node0_fds')} | - | |")
print(f"| console lines of node 0 | {cell('ddprun_node0_console_lines')} | - | |")
print(f"| console lines of any other node, at most | {cell('ddprun_other_node_most_console_lines')} | "
      f"{cell('torchrun_most_console_lines')} | |")
print(f"\n{len(runs)} runs, {hosts} hosts.")
EOF
