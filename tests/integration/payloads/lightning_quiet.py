"""A Lightning Trainer on CPU, 2 devices a node, DDP, training for SECONDS with Lightning's
default progress bar (rich: installed) and nothing else printed. Detached, with no terminal,
the rich bar draws nothing until the end: the run is silent while it trains.

Usage: lightning_quiet.py NUM_NODES SECONDS. Every rank prints one JSON line at the end: its
global rank and the steps it trained.
"""

import json
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Busy(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(256, 256)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        (x,) = batch
        for _ in range(4):  # some work a step: the ranks compute, not wait
            x = torch.tanh(self.layer(x))
        return x.pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(num_nodes: int, seconds: int) -> None:
    torch.manual_seed(0)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        num_nodes=num_nodes,
        strategy="ddp",
        max_epochs=-1,
        max_time={"seconds": seconds},
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(Busy(), DataLoader(TensorDataset(torch.randn(512, 256)), batch_size=64))
    record = {"quiet": True, "rank": trainer.global_rank, "steps": trainer.global_step}
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
