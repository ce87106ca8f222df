"""A small real PyTorch Lightning job for the benchmarks on the namespace bed (bench/lightning-bed.sh).

`Trainer()` takes its settings from the environment (ddprun's PL_TRAINER_* variables, or the
flags below under torchrun). Each rank writes `<MARKS>/started-<RANK>` when its process starts
and `<MARKS>/first-batch-<RANK>` at its first training batch (wall-clock seconds since the epoch), and trains STEPS steps on the CPU
with gloo. Lightning is not a Debian package: put the sources of lightning 2.2.5,
lightning-utilities 0.10.1 and torchmetrics 1.2.1 on PYTHONPATH (their src/ folders).
"""

import os
import time

# The process has started: before the imports that take most of a rank's start.
with open(os.path.join(os.environ.get("MARKS", "."), f"started-{os.environ['RANK']}"), "w") as mark:
    mark.write(f"{time.time():.6f}\n")

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import lightning.pytorch as pl  # noqa: E402


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(32, 1)
        self.marked = False

    # Debian's torch 1.13 lacks what Lightning 2.2's ShardedTensor hooks import.
    def _register_sharded_tensor_state_dict_hooks_if_available(self) -> None:
        return None

    def on_train_batch_start(self, batch, batch_idx):
        if not self.marked:
            self.marked = True
            marks = os.environ.get("MARKS", ".")
            with open(os.path.join(marks, f"first-batch-{os.environ['RANK']}"), "w") as f:
                f.write(f"{time.time():.6f}\n")

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    steps = int(os.environ.get("STEPS", "20"))
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64 * steps * 8, 32, generator=generator)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=64)
    kwargs = {}
    if "PL_TRAINER_NUM_NODES" not in os.environ:  # torchrun: no PL_TRAINER_* variables
        kwargs = dict(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                      num_nodes=int(os.environ["GROUP_WORLD_SIZE"]), strategy="ddp")
    trainer = pl.Trainer(max_steps=steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, **kwargs)
    trainer.fit(Tiny(), loader)


if __name__ == "__main__":
    main()
