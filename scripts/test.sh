#!/usr/bin/env bash
# Installs what is missing, builds ddprun with warnings as errors, and runs every test
# (unit, sim, e2e), then the fuzz targets for a bounded time. This is what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."

# The e2e tests run a real PyTorch DDP job; install torch unless told not to.
DDPRUN_WITH_TORCH="${DDPRUN_WITH_TORCH:-1}" scripts/install-deps.sh

cmake --preset ci >/dev/null
cmake --build --preset ci -j "$(nproc)"
# The multi-host tests (tests/e2e/testbed.h) build hosts out of namespaces, which needs root.
# As root, a bed that cannot be built fails those tests instead of skipping them; otherwise
# say here, once, that they are skipped and why.
if [ "$(id -u)" = 0 ]; then
  export DDPRUN_REQUIRE_TESTBED=1
else
  echo "note: not root: the multi-host test bed tests (testbed_e2e_test, multihost_e2e_test, netns_e2e_test) are skipped"
fi
ctest --preset ci -j "$(nproc)"

# libFuzzer targets (clang), each for a bounded time on its seed corpus.
if command -v clang++ >/dev/null; then
  cmake --preset fuzz >/dev/null
  cmake --build --preset fuzz -j "$(nproc)" --target job_file_fuzz wire_fuzz core_fuzz auth_fuzz
  for target in build/fuzz/tests/fuzz/*_fuzz; do
    name=$(basename "$target")
    corpus="tests/fuzz/corpus/${name%_fuzz}"
    work=$(mktemp -d)
    cp -r "$corpus"/. "$work"/ 2>/dev/null || true
    echo "fuzz: $name for ${DDPRUN_FUZZ_SECONDS:-20}s"
    "$target" -max_total_time="${DDPRUN_FUZZ_SECONDS:-20}" -print_final_stats=1 "$work" 2>&1 | tail -3
    rm -rf "$work"
  done
fi
