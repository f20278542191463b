"""A Lightning Trainer on CPU, 2 devices a node, DDP: run under torchrun or as a node launcher.

Usage: lightning_job.py NUM_NODES [--fail NODE:LOCAL | --fail-in-step NODE:LOCAL]. With
--fail, that worker raises as training starts, while the others wait 30 s outside any
collective: the failure is the first thing that happens (a peer in a collective would fail
at the same moment, with "Connection closed by peer"). With --fail-in-step, that worker
raises in its third training step while the others all-reduce their gradients (DDP's
backward), so each of them dies of the peer's death: a cascade of tracebacks. Otherwise
every rank prints one JSON line once training is done: its global rank, the world size,
its node rank, the sum of (rank + 1) over every rank (an all-reduce), and whether its
weights agree with rank 0's (DDP kept them in step).
"""

import json
import sys
import time

import lightning as L
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self, fail: str = "", fail_in_step: str = "") -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.fail = fail
        self.fail_in_step = fail_in_step

    def worker(self) -> str:
        return f"{self.trainer.node_rank}:{self.trainer.local_rank}"

    def on_train_start(self) -> None:
        if self.fail == self.worker():
            raise RuntimeError(f"Lightning worker {self.fail} failed on purpose")
        if self.fail:
            time.sleep(30)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        if batch_idx == 2 and self.fail_in_step == self.worker():
            raise RuntimeError(f"Lightning worker {self.fail_in_step} failed in a step on purpose")
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(num_nodes: int, fail: str, fail_in_step: str) -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(96, 8), torch.randn(96, 1))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        num_nodes=num_nodes,
        strategy="ddp",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Tiny(fail, fail_in_step)
    trainer.fit(model, DataLoader(data, batch_size=8))
    total = torch.tensor([float(trainer.global_rank + 1)])
    dist.all_reduce(total)
    weights = model.layer.weight.detach().clone()
    reference = weights.clone()
    dist.broadcast(reference, 0)
    record = {
        "lightning": True,
        "global_rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "node_rank": trainer.node_rank,
        "sum": total.item(),
        "weights_agree": bool(torch.equal(weights, reference)),
        "steps": trainer.global_step,
    }
    sys.stdout.write(json.dumps(record) + "\n")  # one write: whole lines in the node's pipe
    sys.stdout.flush()
    # As torch's docs ask. Without it, torch 2.13 sometimes aborts at exit ("terminate called
    # without an active exception"): gloo's worker thread frees the broadcast's tensors
    # while the interpreter finalizes, and dies taking the GIL (seen in a core dump).
    dist.destroy_process_group()


if __name__ == "__main__":

    def option(name: str) -> str:
        return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else ""

    main(int(sys.argv[1]), option("--fail"), option("--fail-in-step"))
