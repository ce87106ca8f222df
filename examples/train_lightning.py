"""A tiny PyTorch Lightning job for ddprun: `Trainer()` takes no arguments.

ddprun sets TORCHELASTIC_RUN_ID (so Lightning picks TorchElasticEnvironment), RANK,
WORLD_SIZE, ... and one PL_TRAINER_<KEY> per [trainer] key of the job file (accelerator,
devices, num_nodes, strategy, precision), which Lightning reads as the Trainer's defaults.
"""

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl
except ImportError:  # Lightning < 2.0 ships as pytorch_lightning
    import pytorch_lightning as pl


class TinyRegressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(32, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss, prog_bar=True, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=None,
                        help="overrides [trainer] max_epochs")
    args = parser.parse_args()

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 32, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=64)

    # No arguments on purpose: the job file's [trainer] arrives as PL_TRAINER_* defaults.
    trainer = pl.Trainer()
    if args.epochs is not None:
        trainer.fit_loop.max_epochs = args.epochs
    trainer.fit(TinyRegressor(), loader)
    if trainer.global_rank == 0:
        print(f"done: world size {trainer.world_size}, {trainer.num_nodes} nodes x "
              f"{trainer.num_devices} devices", flush=True)


if __name__ == "__main__":
    main()
