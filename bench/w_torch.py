"""Benchmark worker for warm starts (bench/warm.sh): a real gloo DDP job, the same under ddprun
(cold or warm) and torchrun. Appends one line per event to $BENCH_MARKS, as bench/w_mark.sh does:
    main|train|fail  RANK  ROUND  EPOCH_SECONDS
"main": the script's first line runs (before its imports); "train": its first optimizer step is
done; "fail": rank FAIL_RANK raises at step FAIL_STEP of round 0. Then STEPS steps of STEP_S
each, and exit 0. Its pid goes to $BENCH_MARKS.pids."""
import os
import time

MAIN_AT = time.time()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

RANK = int(os.environ["RANK"])
ROUND = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def mark(kind, at=None):
    with open(os.environ["BENCH_MARKS"], "a") as marks:
        marks.write("%s %d %d %.6f\n" % (kind, RANK, ROUND, time.time() if at is None else at))


def main():
    with open(os.environ["BENCH_MARKS"] + ".pids", "a") as pids:
        pids.write("%d\n" % os.getpid())
    mark("main", MAIN_AT)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(64, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps, step_s = int(os.environ.get("STEPS", "40")), float(os.environ.get("STEP_S", "0.05"))
    for step in range(steps):
        x = torch.randn(16, 64)
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 0:
            mark("train")
        if RANK == int(os.environ.get("FAIL_RANK", "3")) and ROUND == 0 and step == int(os.environ.get("FAIL_STEP", "5")):
            mark("fail")
            raise RuntimeError("rank %d fails on purpose" % RANK)
        time.sleep(step_s)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
