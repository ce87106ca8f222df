#!/usr/bin/env bash
# Runs every ddprun-vs-torchrun benchmark in one go on a fresh machine (about 10-15 minutes with
# the installs and the build) and rewrites the tables of docs/performance.md:
#   1. installs what it needs: scripts/install-deps.sh with DDPRUN_WITH_TORCH=1 (build deps and
#      Debian's python3-torch, never with Recommends), plus hyperfine;
#   2. builds ddprun in release mode in build/bench (BUILD_DIR);
#   3. runs bench/launch.sh, rendezvous.sh, failure.sh, restart.sh, memory.sh, nostart.sh,
#      logs.sh, check.sh (each says what it measures in its header) and bench/sim_scale.sh if
#      it exists;
#   4. renders bench/out/results.tsv into docs/performance.md (bench/render.py).
# Raw output: bench/out/ (git-ignored). SKIP_INSTALL=1 / SKIP_BUILD=1 skip steps 1 / 2;
# ONLY="launch failure" runs only those scripts (the tables then show only those).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
export BUILD_DIR=${BUILD_DIR:-$REPO/build/bench}
export BENCH_OUT=${BENCH_OUT:-$REPO/bench/out}
start=$SECONDS

if [[ "${SKIP_INSTALL:-0}" != 1 ]]; then
  DDPRUN_WITH_TORCH=1 scripts/install-deps.sh
  if ! command -v hyperfine >/dev/null; then
    sudo=""
    [[ $(id -u) -ne 0 ]] && sudo=sudo
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends hyperfine
  fi
fi
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDPRUN_TESTS=OFF >/dev/null
  targets=(ddprun)
  # bench/sim_scale.sh (the simulator rows) uses the same build directory when it exists.
  [[ -x bench/sim_scale.sh ]] && targets+=(ddprun_sim_bench)
  cmake --build "$BUILD_DIR" -j "${JOBS:-2}" --target "${targets[@]}"
fi
echo "[bench] setup took $((SECONDS - start)) s" >&2

rm -rf "$BENCH_OUT"
mkdir -p "$BENCH_OUT"
: >"$BENCH_OUT/results.tsv"

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo) memory, $(. /etc/os-release && echo "$PRETTY_NAME"), kernel $(uname -r)"
  echo "ddprun: $("$BUILD_DIR/cli/ddprun" --version) (git $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- runner schema 2>/dev/null || echo ', with uncommitted changes under runner/ or schema/'), Release build)"
  echo "torchrun: Debian python3-torch $(dpkg-query -W -f='${Version}' python3-torch) (torch.__version__ $(/usr/bin/python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)), Python $(/usr/bin/python3 -c 'import platform; print(platform.python_version())'), run as \`/usr/bin/python3 -m torch.distributed.run --redirects 9:1 --tee 9:1\`"
  echo "$(hyperfine --version), $(bash --version | head -1 | sed 's/ (.*//')"
  echo "load before the run: $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min); CPU idle share before each set: bench/out/quiet.log"
} >"$BENCH_OUT/meta.txt"

scripts=(launch rendezvous failure restart memory nostart logs check)
[[ -n "${ONLY:-}" ]] && read -r -a scripts <<<"$ONLY"
for s in "${scripts[@]}"; do
  t=$SECONDS
  echo "[bench] ---- $s ----" >&2
  bash "bench/$s.sh" || echo "[bench] $s.sh failed (rc $?); its rows are missing" >&2
  echo "[bench] $s took $((SECONDS - t)) s" >&2
done

sim="-"
if [[ -x bench/sim_scale.sh ]]; then
  echo "[bench] ---- sim_scale ----" >&2
  timeout -k 5 300 bench/sim_scale.sh "$BUILD_DIR" >"$BENCH_OUT/sim_scale.txt" || echo "[bench] sim_scale.sh failed" >&2
  sim="$BENCH_OUT/sim_scale.txt"
fi

echo "whole run (installs, build, benchmarks): $((SECONDS - start)) s; reproduce with \`bench/run.sh\`" >>"$BENCH_OUT/meta.txt"
/usr/bin/python3 bench/render.py "$BENCH_OUT/results.tsv" "$BENCH_OUT/meta.txt" "$sim" docs/performance.md
echo "[bench] done in $((SECONDS - start)) s; docs/performance.md rewritten" >&2
