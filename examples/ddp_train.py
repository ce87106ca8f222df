"""Plain PyTorch DDP under ddprun (or torchrun): everything comes from the environment.

init_process_group("env://") reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE; the backend
follows PL_TRAINER_ACCELERATOR (gloo on CPU, nccl on GPU). Trains a tiny linear model on random
data for a few steps, checks an all_reduce, and prints what each rank saw. With
--checkpoint-dir, rank 0 saves a checkpoint after every step and a restarted job resumes from it
(the directory must be one that every node sees, e.g. a shared file system). Runs with
torch 1.13 on Python 3.11 and with torch 2.x.
"""

import argparse
import gc
import json
import os
import threading
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

try:  # ddprun puts its module on PYTHONPATH; under torchrun the beacons are simply left out
    import ddprun
except ImportError:
    ddprun = None


def load_checkpoint(directory: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Loads DIR/checkpoint.pt into `model` and `optimizer` if it exists; the step to resume from."""
    path = os.path.join(directory, "checkpoint.pt")
    if not os.path.exists(path):
        return 0
    state = torch.load(path, map_location="cpu")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["step"]


def save_checkpoint(directory: str, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer) -> None:
    """Saves DIR/checkpoint.pt atomically: a reader (or a crash) never sees half a file."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "checkpoint.pt")
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
               path + ".tmp")
    os.replace(path + ".tmp", path)


def wait_forever() -> None:
    """A deadlock, as a data loader or a lock gone wrong would make one (for tests)."""
    threading.Event().wait()


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
    parser.add_argument("--step-time", type=float, default=0.0,
                        help="seconds of extra work per step (to make steps observable)")
    parser.add_argument("--hang-rank", type=int, default=-1,
                        help="this global rank blocks for ever before an all_reduce (for tests)")
    parser.add_argument("--hang-attempt", type=int, default=0, help="...in this attempt only")
    parser.add_argument("--hang-step", type=int, default=3, help="...at this step")
    parser.add_argument("--slow-rank", type=int, default=-1,
                        help="this global rank does this many times the work per step (for tests)")
    parser.add_argument("--slow-factor", type=float, default=3.0)
    parser.add_argument("--checkpoint-dir", default="",
                        help="rank 0 saves checkpoint.pt here after every step; every rank "
                             "resumes from it on start (a directory every node sees)")
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
    module = torch.nn.Linear(16, 1).to(device)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
    first_step = 0
    if args.checkpoint_dir:
        # Before DDP wraps the module, so that rank 0 cannot save the next step while others load.
        first_step = load_checkpoint(args.checkpoint_dir, module, optimizer)
        if first_step > 0:
            print(f"rank {rank}: resumed from step {first_step}", flush=True)
    model = DistributedDataParallel(module, device_ids=[local_rank] if use_cuda else None)
    torch.manual_seed(1234 + rank)
    for step in range(first_step, args.steps):
        started = time.monotonic()
        x = torch.randn(32, 16, device=device)
        y = x.sum(dim=1, keepdim=True)
        work = args.step_time * (args.slow_factor if rank == args.slow_rank else 1.0)
        if work > 0:
            time.sleep(work)
        if rank == args.hang_rank and attempt == args.hang_attempt and step == args.hang_step:
            print(f"rank {rank} blocks before the all_reduce of step {step}", flush=True)
            wait_forever()
        loss = torch.nn.functional.mse_loss(model(x), y)
        busy = time.monotonic() - started  # this rank's own work: backward waits for the others
        optimizer.zero_grad()
        loss.backward()
        dist.all_reduce(torch.ones(1, device=device))
        optimizer.step()
        if args.checkpoint_dir and rank == 0:
            save_checkpoint(args.checkpoint_dir, step + 1, module, optimizer)
        if ddprun:
            ddprun.progress(step + 1, busy=busy)
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
    # DDP's reducer holds the process group too. Were it the last holder, torch 1.13 would
    # destroy the gloo group with the GIL held, joining gloo threads that may still need the GIL
    # to free a tensor: a deadlock at exit (pytorch/pytorch#56297). So the reducer goes first.
    del model
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
