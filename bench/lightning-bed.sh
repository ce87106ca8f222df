#!/usr/bin/env bash
# A real Lightning job across three stock hosts of the namespace bed (issue 39.5), ddprun and
# torchrun side by side in one run: lightning 2.2.5, 3 hosts x 2 ranks, gloo on the CPU,
# bench/w_lightning.py. The hosts are named in the job file and nothing else is set; torchrun
# runs with the c10d rendezvous at gpu-01 and GLOO_SOCKET_IFNAME set by hand on each host (its
# users must: gloo binds 127.0.1.1 otherwise). Figure: first agent launched -> every rank at its
# first training batch, and -> every rank's process started (before its imports), which splits
# the launcher's share from the ranks' own (tests/e2e/rack_test.cc, RackTest.Lightning...).
# Lightning is not a Debian package: LIGHTNING_PATH must name the src/ folders of lightning
# 2.2.5, lightning-utilities 0.10.1 and torchmetrics 1.2.1 (colon-separated), kept outside the
# repository. Needs root (the bed), python3-torch, python3-packaging, python3-fsspec and
# python3-tqdm. RUNS (default 3).
source "$(dirname "$0")/common.sh"
RUNS=${RUNS:-3}
RACK_TEST=${RACK_TEST:-$BUILD_DIR/tests/e2e/rack_e2e_test}
[[ -n ${LIGHTNING_PATH:-} ]] || { log "set LIGHTNING_PATH to the Lightning sources' src/ folders"; exit 1; }
[[ -x $RACK_TEST ]] || { log "no $RACK_TEST: build the tests (cmake --build $BUILD_DIR)"; exit 1; }
[[ $(id -u) == 0 ]] || { log "the namespace bed needs root"; exit 1; }

dir=$(scratch lightning-bed)
for ((r = 0; r < RUNS; r++)); do
  wait_quiet "lightning on the bed: 3 hosts x 2 ranks, ddprun then torchrun (run $((r + 1)) of $RUNS)"
  LIGHTNING_PATH=$LIGHTNING_PATH DDPRUN_REQUIRE=testbed,torch \
    timeout -k 5 900 "$RACK_TEST" --gtest_filter='RackTest.Lightning*' --gtest_output="json:$dir/run-$r.json" \
    >"$dir/run-$r.out" 2>&1 || { log "run $r failed; see $dir/run-$r.out"; tail -20 "$dir/run-$r.out" >&2; exit 1; }
done

"$PYTHON" - "$dir" <<'EOF'
import glob, json, statistics, sys
runs = []
for path in sorted(glob.glob(sys.argv[1] + "/run-*.json")):
    test = json.load(open(path))["testsuites"][0]["testsuite"][0]
    runs.append({k: float(v) / 1000 for k, v in test.items() if k.endswith(("_first_batch_ms", "_started_ms"))})
def cell(key):
    values = [r[key] for r in runs]
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"
dd = statistics.median(r["ddprun_first_batch_ms"] for r in runs)
tr = statistics.median(r["torchrun_first_batch_ms"] for r in runs)
print("| figure | ddprun | torchrun c10d | torchrun / ddprun |")
print("|---|---|---|---|")
sd = statistics.median(r["ddprun_workers_started_ms"] for r in runs)
st = statistics.median(r["torchrun_workers_started_ms"] for r in runs)
print(f"| first agent launched -> every rank's process started (s) | {cell('ddprun_workers_started_ms')} | "
      f"{cell('torchrun_workers_started_ms')} | {st / sd:.1f} |")
print(f"| first agent launched -> every rank at its first batch (s) | {cell('ddprun_first_batch_ms')} | "
      f"{cell('torchrun_first_batch_ms')} | {tr / dd:.2f} |")
print(f"\n{len(runs)} runs.")
EOF
