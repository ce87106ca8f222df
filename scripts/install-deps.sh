#!/usr/bin/env bash
# Installs exactly what ddprun's build and tests need, from Debian's packages. Idempotent:
# it only calls apt-get when something is missing. Boost 1.81 only (Process v2); never
# libboost-dev, which is 1.74 and conflicts.
set -euo pipefail

packages=(
  cmake ninja-build g++ clang
  clang-format  # the formatting of every C/C++ file (tests/tidy/format_check.sh)
  git  # the same check compares with a commit
  libtomlplusplus-dev libspdlog-dev libfmt-dev
  libboost1.81-dev libboost-filesystem1.81-dev
  libcli11-dev nlohmann-json3-dev libssl-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  iproute2 iptables nftables python3
  debootstrap  # the Debian 11 root of the portable build and its test (scripts/package.sh)
  strace  # delays a system call of a real agent in tests/e2e (a slow NFS read at start)
  etcd-server etcd-client  # [rendezvous] backend = "etcd": the 3-member cluster in tests/e2e
  chromium  # the browser test of the report pages (tests/browser); skipped without it
  openssh-server openssh-client  # `ddprun up` through real sshd on the test bed (tests/e2e/up_test.cc)
  slurmctld slurmd slurm-client munge  # `srun ddprun` under a real SLURM (tests/e2e/slurm_test.cc)
  prometheus  # prometheus and promtool: the metrics endpoint scraped by a real server (tests/e2e)
)
if [[ "${DDPRUN_WITH_TORCH:-0}" == 1 ]]; then
  packages+=(python3-torch)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
