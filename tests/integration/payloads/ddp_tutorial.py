"""Our own job written to the contract of PyTorch's DDP tutorial (``distributed/
ddp-tutorial-series/multinode.py`` in pytorch/examples), on CPU: a torchrun job that reads
LOCAL_RANK and RANK, trains a Linear(20, 1) on 2048 random samples with a DistributedSampler,
prints ``[GPU<rank>] Epoch <e> | Batchsize: <b> | Steps: <n>`` every epoch and has rank 0
save a snapshot every ``save_every`` epochs. The tests run the real file too when a
checkout of pytorch/examples is there (docs/development.md, "Tests with third-party code").

Usage: ddp_tutorial.py TOTAL_EPOCHS SAVE_EVERY [--batch_size N]
"""

import argparse
import os

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class RandomSet(Dataset):
    def __init__(self, size: int) -> None:
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple:
        return self.data[index]


def train(total_epochs: int, save_every: int, batch_size: int) -> None:
    init_process_group(backend="gloo")
    rank = int(os.environ["RANK"])
    int(os.environ["LOCAL_RANK"])  # the contract: torchrun sets it
    dataset = RandomSet(2048)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=DistributedSampler(dataset))
    model = DDP(torch.nn.Linear(20, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for epoch in range(total_epochs):
        size = len(next(iter(loader))[0])
        print(f"[GPU{rank}] Epoch {epoch} | Batchsize: {size} | Steps: {len(loader)}")
        loader.sampler.set_epoch(epoch)
        for source, targets in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(source), targets).backward()
            optimizer.step()
        if rank == 0 and epoch % save_every == 0:
            torch.save(
                {"MODEL_STATE": model.module.state_dict(), "EPOCHS_RUN": epoch}, "snapshot.pt"
            )
            print(f"Epoch {epoch} | Training snapshot saved at snapshot.pt")
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("save_every", type=int)
    parser.add_argument("--batch_size", default=32, type=int)
    args = parser.parse_args()
    train(args.total_epochs, args.save_every, args.batch_size)
