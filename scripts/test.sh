#!/usr/bin/env bash
# Installs what is missing, builds ddprun with warnings as errors and runs every test (unit,
# sim, io, e2e, browser), then builds the unit, sim and io tests with ASan + UBSan and runs them
# again, then the fuzz targets for a bounded time. This is what CI runs (.ci/run);
# docs/testing.md says what each stage covers and how long it takes.
set -euo pipefail
cd "$(dirname "$0")/.."

# The e2e tests run a real PyTorch DDP job; install torch unless told not to.
with_torch="${DDPRUN_WITH_TORCH:-1}"
DDPRUN_WITH_TORCH="$with_torch" scripts/install-deps.sh

# Tests that need a part of the machine (etcd, the namespace test bed, torch, chromium,
# prometheus) skip
# without it, unless DDPRUN_REQUIRE names the part: then they fail (tests/support/require.h).
# Unless the caller says otherwise (DDPRUN_REQUIRE= runs with skips), require what
# install-deps.sh has just installed, so that a missing part fails the run instead of
# passing it with skips. The test bed also needs root.
if [ -z "${DDPRUN_REQUIRE+set}" ]; then
  DDPRUN_REQUIRE="etcd,chromium,prometheus"
  if [ "$with_torch" = 1 ]; then DDPRUN_REQUIRE+=",torch"; fi
  if [ "$(id -u)" = 0 ]; then
    DDPRUN_REQUIRE+=",testbed"
  else
    echo "note: not root: the test bed tests (namespaces, iptables, a full disk) are skipped"
  fi
fi
export DDPRUN_REQUIRE
echo "test.sh: DDPRUN_REQUIRE=$DDPRUN_REQUIRE"

# ccache where it is installed: a rebuild of unchanged sources costs seconds. Not required.
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi

SECONDS=0
cmake --preset ci "${launcher[@]}" >/dev/null
cmake --build --preset ci -j "$(nproc)"
echo "test.sh: ci build ${SECONDS}s"
SECONDS=0
ctest --preset ci -j "$(nproc)"
echo "test.sh: ci tests ${SECONDS}s"

# The unit, sim and io tests (not e2e: their timing bounds assume an optimised ddprun) under
# AddressSanitizer and UndefinedBehaviorSanitizer; the asan test preset sets halt_on_error and
# runs only those labels. The first report ends the process that has it. ASan's (and LSan's)
# also go to files, so that one in a ddprun that a test runs as a child process fails the run
# even where the test accepted that child's exit status; UBSan's runtime ignores log_path when
# it runs beside ASan, so the preset makes its reports abort (SIGABRT), which no test takes for
# an ordinary exit.
SECONDS=0
cmake --preset asan "${launcher[@]}" >/dev/null
cmake --build --preset asan -j "$(nproc)" --target sanitized_tests
echo "test.sh: asan build ${SECONDS}s"
SECONDS=0
reports=$(mktemp -d)
export ASAN_OPTIONS="log_path=$reports/asan"
status=0
ctest --preset asan -j "$(nproc)" || status=$?
if compgen -G "$reports/*" >/dev/null; then
  echo "test.sh: sanitizer reports:"
  cat "$reports"/*
  status=1
fi
rm -rf "$reports"
unset ASAN_OPTIONS
echo "test.sh: asan tests ${SECONDS}s"
if [ "$status" != 0 ]; then exit "$status"; fi

# libFuzzer targets (clang), each for a bounded time on its seed corpus.
if command -v clang++ >/dev/null; then
  cmake --preset fuzz "${launcher[@]}" >/dev/null
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

# The portable artifact (docs/install.md): scripts/package.sh builds it against a Debian 11
# root's glibc (debootstrap from the Debian mirror the first time, kept in build/deb11-root) and
# packs the tarball and the .deb; tests/package/package_test.sh runs both on a copy of that
# root. chroot and debootstrap need root; elsewhere it is skipped unless DDPRUN_REQUIRE says
# "package".
if [ "$(id -u)" = 0 ]; then
  SECONDS=0
  scripts/package.sh >build/package.list
  mapfile -t artifacts <build/package.list
  bash tests/package/package_test.sh "${artifacts[0]}" "${artifacts[1]}" build/deb11-root
  echo "test.sh: package ${SECONDS}s"
elif [[ ",$DDPRUN_REQUIRE," == *",package,"* ]]; then
  echo "test.sh: the package test needs root (chroot, debootstrap)"
  exit 1
else
  echo "note: not root: the portable package is not built or tested"
fi
