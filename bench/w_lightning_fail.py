"""Benchmark worker for warm starts with real Lightning (bench/warm.sh, WORKLOAD=lightning): the
same marks as bench/w_torch.py, appended to $BENCH_MARKS:
    main|train|fail  RANK  ROUND  EPOCH_SECONDS
"main": the script's first line runs; "train": its first training batch of the round starts;
"fail": rank FAIL_RANK raises at step FAIL_STEP of round 0. STEPS steps of STEP_S each, on the
CPU with gloo; `Trainer()` takes its settings from ddprun's PL_TRAINER_* variables (torchrun:
from the flags below). Its pid goes to $BENCH_MARKS.pids. Lightning is not a Debian package:
put the src/ folders of lightning 2.2.5, lightning-utilities 0.10.1 and torchmetrics 1.2.1 on
PYTHONPATH."""
import os
import time

MAIN_AT = time.time()

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import lightning.pytorch as pl  # noqa: E402

RANK = int(os.environ["RANK"])
ROUND = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
FAIL_RANK = int(os.environ.get("FAIL_RANK", "3"))
FAIL_STEP = int(os.environ.get("FAIL_STEP", "5"))
STEP_S = float(os.environ.get("STEP_S", "0.05"))


def mark(kind, at=None):
    with open(os.environ["BENCH_MARKS"], "a") as marks:
        marks.write("%s %d %d %.6f\n" % (kind, RANK, ROUND, time.time() if at is None else at))


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(64, 8)

    # Debian's torch 1.13 lacks what Lightning 2.2's ShardedTensor hooks import.
    def _register_sharded_tensor_state_dict_hooks_if_available(self):
        return None

    def on_train_batch_start(self, batch, batch_idx):
        if batch_idx == 0:
            mark("train")

    def training_step(self, batch, batch_idx):
        if RANK == FAIL_RANK and ROUND == 0 and batch_idx == FAIL_STEP:
            mark("fail")
            raise RuntimeError("rank %d fails on purpose" % RANK)
        time.sleep(STEP_S)
        (x,) = batch
        return self.layer(x).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main():
    with open(os.environ["BENCH_MARKS"] + ".pids", "a") as pids:
        pids.write("%d\n" % os.getpid())
    mark("main", MAIN_AT)
    steps = int(os.environ.get("STEPS", "60"))
    loader = DataLoader(TensorDataset(torch.randn(16 * steps * 4, 64)), batch_size=16)
    kwargs = {}
    if "PL_TRAINER_NUM_NODES" not in os.environ:  # torchrun: no PL_TRAINER_* variables
        kwargs = dict(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                      num_nodes=int(os.environ["GROUP_WORLD_SIZE"]), strategy="ddp")
    trainer = pl.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, **kwargs)
    trainer.fit(Tiny(), loader)


if __name__ == "__main__":
    main()
