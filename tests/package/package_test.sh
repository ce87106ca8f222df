#!/usr/bin/env bash
# The portable artifact where users are (issue 41): scripts/package.sh's tarball and .deb on a
# Debian 11 root (glibc 2.31, Python 3.9) with nothing of ddprun's build on it.
#   tests/package/package_test.sh TARBALL DEB ROOT     (root: chroot, mount)
# 1. the binary needs no glibc symbol newer than 2.31 and no shared library but glibc's;
# 2. from the tarball, in the root: --version, the simulator on examples/laptop.toml, a real
#    2-rank job of shell workers, and a Python 3.9 worker whose `import ddprun` sends beacons;
# 3. `apt-get install ./ddprun_*.deb` into a copy of the root, then the same job from /usr/bin;
# 4. `ddprun up --install` from here (the tarball's binary) to a "host" that is a clean copy of
#    the root without ddprun (a stand-in for ssh runs the remote line chrooted there): the copy
#    lands in the root's ~/.ddprun and runs the job; the next `up` finds it.
set -euo pipefail
tarball=$(realpath "$1") deb=$(realpath "$2") root=$(realpath "$3")
source_dir=$(cd "$(dirname "$0")/../.." && pwd)
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -C "$work" -xzf "$tarball"
unpacked=$(echo "$work"/ddprun-*-linux-x86_64)
binary="$unpacked/bin/ddprun"

# 1. What the binary asks of the system.
newest=$(objdump -T "$binary" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
if [[ $(printf '%s\n2.31\n' "$newest" | sort -V | tail -1) == 2.31 ]]; then
  pass "newest glibc symbol version: $newest (at most 2.31)"
else
  fail "the binary needs glibc $newest (symbols: $(objdump -T "$binary" | grep -o 'GLIBC_2\.3[2-9][0-9.]*' | sort -u | tr '\n' ' '))"
fi
needed=$(readelf -d "$binary" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | sort | tr '\n' ' ')
extra=$(tr ' ' '\n' <<<"$needed" | grep -v -E '^(libc|libm|libpthread|libdl|librt|ld-linux-x86-64)\.so\.[0-9]+$|^$' || true)
if [[ -z $extra ]]; then pass "shared libraries: $needed"; else fail "it needs more than glibc: $extra"; fi

# Runs COMMAND in ROOT_DIR as a chroot with its own /proc, in a mount namespace of its own.
in_root() {
  local dir=$1
  shift
  unshare --mount --propagation private --fork -- sh -c \
    'mount -t proc proc "$0/proc" && exec chroot "$0" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root "$@"' \
    "$dir" "$@"
}

# A job of shell workers and one of a Python worker that imports ddprun, both 1 node x 2.
jobs_into() {  # DIR (inside a root)
  mkdir -p "$1"
  cp "$source_dir/examples/laptop.toml" "$1/"
  printf 'version = 1\n[job\n' >"$1/broken.toml"
  cat >"$1/shell.toml" <<TOML
version = 1
[job]
name = "shell"
command = ["sh", "-c", "echo rank \$RANK of \$WORLD_SIZE at \$MASTER_ADDR:\$MASTER_PORT"]
[cluster]
nnodes = 1
master_addr = "127.0.0.1"
master_port = 29617
[trainer]
devices = 2
TOML
  cat >"$1/beacons.py" <<'PY'
import os, sys, time
import ddprun
for step in range(3):
    ddprun.progress(step)
    time.sleep(0.05)
print("python %s rank %s beacons %s" % (sys.version.split()[0], os.environ["RANK"], "on" if ddprun._sender else "off"))
PY
  cat >"$1/python.toml" <<TOML
version = 1
[job]
name = "python"
command = ["python3", "beacons.py"]
[cluster]
nnodes = 1
master_addr = "127.0.0.1"
master_port = 29618
[trainer]
devices = 2
TOML
}

check_jobs() {  # ROOT_DIR DDPRUN_IN_ROOT LABEL
  local dir=$1 ddprun=$2 label=$3 out
  out=$(in_root "$dir" "$ddprun" --version 2>&1) || true
  if grep -q '^build portable: glibc 2.31 or newer' <<<"$out"; then pass "$label: --version: $(head -1 <<<"$out")"; else fail "$label: --version: $out"; fi
  out=$(in_root "$dir" sh -c "cd /job && $ddprun --simulate laptop.toml" 2>&1) || true
  if grep -q 'job "laptop" succeeded' <<<"$out"; then pass "$label: --simulate laptop.toml"; else fail "$label: --simulate: $(tail -5 <<<"$out")"; fi
  # A job file with a TOML syntax error: toml++ throws, and the exception's unwinding needs
  # what cli/glibc_compat.cc gives libgcc on glibc 2.31 (_dl_find_object).
  out=$(in_root "$dir" sh -c "cd /job && $ddprun check broken.toml; echo exit \$?" 2>&1) || true
  if grep -q "broken.toml:2:5: error: invalid TOML" <<<"$out" && grep -q "^exit 2$" <<<"$out"; then
    pass "$label: check of a broken file (an exception, unwound)"
  else
    fail "$label: check broken.toml: $(tail -5 <<<"$out")"
  fi
  out=$(in_root "$dir" sh -c "cd /job && $ddprun shell.toml" 2>&1) || true
  if grep -q '\[n0 r1\] rank 1 of 2 at 127.0.0.1:29617' <<<"$out" && grep -q 'job "shell" succeeded' <<<"$out"; then
    pass "$label: a real 2-rank job of shell workers"
  else
    fail "$label: shell job: $(tail -8 <<<"$out")"
  fi
  out=$(in_root "$dir" sh -c "cd /job && $ddprun python.toml" 2>&1) || true
  if grep -q '\[n0 r1\] python 3.9.[0-9]* rank 1 beacons on' <<<"$out" && grep -q 'job "python" succeeded' <<<"$out"; then
    pass "$label: Python 3.9 workers that import ddprun and send beacons"
  else
    fail "$label: python job: $(tail -8 <<<"$out")"
  fi
}

# 2. The tarball, unpacked into the root (a copy: the cached root stays clean).
copy="$work/root-tar"
cp -a "$root" "$copy"
mkdir -p "$copy/opt"
cp -a "$unpacked" "$copy/opt/ddprun"
jobs_into "$copy/job"
check_jobs "$copy" /opt/ddprun/bin/ddprun tarball
rm -rf "$copy"

# 3. The .deb, installed by apt-get into another copy.
copy="$work/root-deb"
cp -a "$root" "$copy"
cp "$deb" "$copy/tmp/"
if in_root "$copy" sh -c "DEBIAN_FRONTEND=noninteractive apt-get install -y /tmp/$(basename "$deb")" >"$work/apt.log" 2>&1; then
  pass ".deb: apt-get install ./$(basename "$deb")"
  jobs_into "$copy/job"
  check_jobs "$copy" /usr/bin/ddprun .deb
else
  fail ".deb: apt-get install: $(tail -5 "$work/apt.log")"
fi
rm -rf "$copy"

# 4. `up --install` to a Debian 11 host without ddprun: its sh, tar, find and sha256sum.
copy="$work/root-up"
cp -a "$root" "$copy"
jobdir="$work/upjob"  # the same path here and in the root, as on hosts that share no folder
mkdir -p "$jobdir" "$copy$jobdir"
cat >"$jobdir/up.toml" <<TOML
version = 1
[job]
name = "upinstall"
command = ["sh", "-c", "echo rank \$RANK runs under \$(readlink /proc/\$PPID/exe)"]
[cluster]
nodes = ["deb11"]
master_addr = "127.0.0.1"
master_port = 29619
[trainer]
devices = 2
num_nodes = 1
TOML
cat >"$work/chroot-ssh" <<SH
#!/bin/sh
for last; do :; done
exec unshare --mount --propagation private --fork -- sh -c 'mount -t proc proc "\$0/proc" && exec chroot "\$0" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root /bin/sh -c "\$1"' "$copy" "\$last"
SH
chmod +x "$work/chroot-ssh"
out=$(DDPRUN_SSH_COMMAND="$work/chroot-ssh" "$binary" up "$jobdir/up.toml" --copy 2>&1) || true
if grep -q "no \`ddprun\` on the remote PATH, and no copy of this one in ~/.ddprun/" <<<"$out"; then
  pass "up: a Debian 11 host without ddprun is named, with --install as the fix"
else
  fail "up without --install: $(tail -5 <<<"$out")"
fi
out=$(DDPRUN_SSH_COMMAND="$work/chroot-ssh" "$binary" up "$jobdir/up.toml" --copy --install 2>&1) || true
if grep -q "deb11 (node 0): installed in /root/.ddprun/" <<<"$out" &&
  grep -q "\[n0 r1\] rank 1 runs under /root/.ddprun/.*/bin/ddprun" <<<"$out" &&
  grep -q 'job "upinstall" succeeded' <<<"$out"; then
  pass "up --install: the copy in the Debian 11 host's ~/.ddprun ran the job"
else
  fail "up --install: $(tail -8 <<<"$out")"
fi
out=$(DDPRUN_SSH_COMMAND="$work/chroot-ssh" "$binary" up "$jobdir/up.toml" 2>&1) || true
if ! grep -q "installing" <<<"$out" && grep -q "\[n0 r0\] rank 0 runs under /root/.ddprun/" <<<"$out"; then
  pass "up: the next run finds the copy and copies nothing"
else
  fail "up after --install: $(tail -8 <<<"$out")"
fi
rm -rf "$copy"

if ((failures > 0)); then
  echo "package test: $failures failed"
  exit 1
fi
echo "package test: all passed"
