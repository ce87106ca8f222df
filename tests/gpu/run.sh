#!/usr/bin/env bash
# The GPU checks in one go, for a machine with NVIDIA GPUs, the driver, the CUDA toolkit and
# NCCL: builds with -DDDPRUN_CUDA=ON, runs the `gpu` ctest label, `ddprun preflight` on this one
# node with one rank per GPU (printing its NCCL all-reduce bandwidth table), and the C++ NCCL
# example under ddprun. Exit 0 only when every step passed.
set -euo pipefail
cd "$(dirname "$0")/../.."

build=${DDPRUN_GPU_BUILD:-build/gpu}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDPRUN_CUDA=ON >/dev/null
cmake --build "$build" -j "$(nproc)" --target ddprun cpp_ddp_train gpu_test
ddprun="$PWD/$build/cli/ddprun"
train="$PWD/$build/examples/cpp-ddp/cpp_ddp_train"

command -v nvidia-smi >/dev/null && nvidia-smi -L || echo "nvidia-smi not found"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -eq 0 ]; then
  echo "run.sh: no GPU on this machine: nothing to check" >&2
  exit 1
fi
echo "run.sh: $gpus GPU(s)"

DDPRUN_REQUIRE=gpu ctest --test-dir "$build" -L gpu --output-on-failure

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
port=$((29600 + RANDOM % 1000))
cat > "$work/preflight.toml" <<TOML
version = 1
[job]
name = "gpu-preflight"
command = ["false"]
[cluster]
nnodes = 1
master_addr = "127.0.0.1"
master_port = $port
[trainer]
accelerator = "gpu"
devices = $gpus
num_nodes = 1
TOML
echo "== ddprun preflight (1 node x $gpus GPUs)"
"$ddprun" preflight "$work/preflight.toml" --node-rank 0

cat > "$work/cpp-ddp.toml" <<TOML
version = 1
[job]
name = "cpp-ddp"
command = ["$train", "--steps", "200"]
env = { NCCL_DEBUG = "WARN" }
[cluster]
nnodes = 1
master_addr = "127.0.0.1"
master_port = $((port + 1))
[trainer]
accelerator = "gpu"
devices = $gpus
num_nodes = 1
TOML
echo "== examples/cpp-ddp under ddprun ($gpus ranks)"
"$ddprun" run "$work/cpp-ddp.toml" --node-rank 0
echo "run.sh: all GPU checks passed"
