"""Plain PyTorch DDP under ddprun (or torchrun): everything comes from the environment.

init_process_group("env://") reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE; the backend
follows PL_TRAINER_ACCELERATOR (gloo on CPU, nccl on GPU). Trains a tiny linear model on random
data for a few steps, checks an all_reduce, and prints what each rank saw. Runs with
torch 1.13 on Python 3.11 and with torch 2.x.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel


@record  # an uncaught exception lands in TORCHELASTIC_ERROR_FILE, which ddprun quotes
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--fail-rank", type=int, default=-1,
                        help="this global rank raises after the first all_reduce (for tests)")
    parser.add_argument("--fail-attempt", type=int, default=0,
                        help="...in this attempt only (TORCHELASTIC_RESTART_COUNT)")
    parser.add_argument("--result-dir", default="",
                        help="write rank-<r>-attempt-<k>.json with what this rank computed")
    args = parser.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

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

    if rank == args.fail_rank and attempt == args.fail_attempt:
        raise RuntimeError(f"rank {rank} fails on purpose in attempt {attempt}")

    # Same initial weights everywhere (DDP broadcasts rank 0's anyway), different data per rank.
    torch.manual_seed(1234)
    model = DistributedDataParallel(
        torch.nn.Linear(16, 1).to(device), device_ids=[local_rank] if use_cuda else None)
    torch.manual_seed(1234 + rank)
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
    if args.result_dir:
        # DDP keeps the replicas identical: every rank must end with the same weights.
        weights = [round(v, 6) for v in torch.cat(
            [p.detach().flatten().cpu() for p in model.parameters()]).tolist()]
        with open(os.path.join(args.result_dir, f"rank-{rank}-attempt-{attempt}.json"), "w") as f:
            json.dump({"rank": rank, "world": world, "attempt": attempt,
                       "all_reduce": check.item(), "weights": weights,
                       "master_port": os.environ["MASTER_PORT"]}, f)
    if rank == 0:
        print(f"done: {world} ranks, all_reduce ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
