"""Plain PyTorch DDP under ddprun (or torchrun): everything comes from the environment.

init_process_group("env://") reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE; the backend
follows PL_TRAINER_ACCELERATOR (gloo on CPU, nccl on GPU). Trains a tiny linear model on random
data for a few steps, checks an all_reduce, and prints what each rank saw. Runs with
torch 1.13 on Python 3.11 and with torch 2.x.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    accelerator = os.environ.get("PL_TRAINER_ACCELERATOR", "cpu")
    use_cuda = accelerator in ("gpu", "cuda") or (
        accelerator == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ["LOCAL_RANK"])
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend="nccl" if use_cuda else "gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank}/{world} (local {local_rank}, node {os.environ.get('NODE_RANK')}) "
          f"on {device}, run {os.environ.get('TORCHELASTIC_RUN_ID')}, "
          f"attempt {os.environ.get('TORCHELASTIC_RESTART_COUNT')}", flush=True)

    # Every rank contributes rank + 1: the sum is world * (world + 1) / 2 everywhere.
    check = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(check)
    expected = world * (world + 1) / 2
    if check.item() != expected:
        raise SystemExit(f"rank {rank}: all_reduce gave {check.item()}, expected {expected}")

    torch.manual_seed(1234 + rank)
    model = DistributedDataParallel(
        torch.nn.Linear(16, 1).to(device), device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(args.steps):
        x = torch.randn(32, 16, device=device)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step} loss {loss.item():.4f}", flush=True)

    dist.barrier()
    if rank == 0:
        print(f"done: {world} ranks, all_reduce ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
