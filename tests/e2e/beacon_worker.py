"""A torch.distributed (gloo) worker for hang_test.cc: one all_reduce per step, a progress beacon
after each, and the CLOCK_MONOTONIC time of each beacon printed, so that the test knows the
intervals ddprun saw (std::chrono::steady_clock reads the same clock).

Prints "rank R beacon S at T" after each beacon and "rank R blocks at T" before it hangs.
"""

import argparse
import os
import threading
import time

import torch
import torch.distributed as dist

import ddprun  # on PYTHONPATH under ddprun; this worker runs nowhere else


def wait_forever() -> None:
    threading.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    # Above the module's 0.1 s throttle, so that every beacon goes out and is printed.
    parser.add_argument("--step-time", type=float, default=0.15)
    parser.add_argument("--long-step", type=int, default=-1, help="this step sleeps --long-time")
    parser.add_argument("--long-time", type=float, default=0.0)
    parser.add_argument("--hang-rank", type=int, default=-1,
                        help="blocks for ever before the all_reduce of --hang-step, in attempt 0")
    parser.add_argument("--hang-step", type=int, default=0)
    args = parser.parse_args()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])

    dist.init_process_group(backend="gloo", init_method="env://")
    rank = dist.get_rank()
    for step in range(args.steps):
        time.sleep(args.long_time if step == args.long_step else args.step_time)
        if rank == args.hang_rank and attempt == 0 and step == args.hang_step:
            print(f"rank {rank} blocks at {time.monotonic():.6f}", flush=True)
            wait_forever()
        dist.all_reduce(torch.ones(1))
        sent = time.monotonic()
        ddprun.progress(step + 1)
        print(f"rank {rank} beacon {step + 1} at {sent:.6f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
