"""A Lightning Trainer on CPU, 2 ranks on one node (DDP), drawing Lightning's default progress
bar (RichProgressBar: rich is installed) over 12 training steps and 6 validation steps.

argv: GATE_DIR. Every rank stops at training step 5 until GATE_DIR/train exists, and at
validation step 3 until GATE_DIR/val does: the test reads the screen while the bars are
partway, redrawn meanwhile (rich redraws at most once a second). Then rank 0 prints
``fit done``.
"""

import os
import sys
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

GATES = sys.argv[1]


def gate(trainer: L.Trainer, name: str) -> None:
    """Wait for GATE_DIR/name, the bar redrawn meanwhile as a running step's would be."""
    while not os.path.exists(os.path.join(GATES, name)):
        refresh = getattr(trainer.progress_bar_callback, "refresh", None)  # RichProgressBar's
        if refresh is not None:
            refresh()
        time.sleep(0.1)


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        if batch_idx == 5:
            gate(self.trainer, "train")
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        if batch_idx == 3 and not self.trainer.sanity_checking:
            gate(self.trainer, "val")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(96, 8), torch.randn(96, 1))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    # 96 samples over 2 ranks: 12 training batches of 4, 6 validation batches of 8
    trainer.fit(Tiny(), DataLoader(data, batch_size=4), DataLoader(data, batch_size=8))
    if trainer.global_rank == 0:
        print("fit done", flush=True)


if __name__ == "__main__":
    main()
