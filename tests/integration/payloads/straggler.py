"""A tiny DDP model trained by every rank, gradients all-reduced every step (gloo), until
it is stopped. ``straggler.py MODE RANK``: rank RANK sleeps 0.2 s a step (MODE sleep, as
slow data loading) or computes more each step (MODE compute); MODE even: no rank does."""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

MODE = sys.argv[1] if len(sys.argv) > 1 else "even"
ODD = int(sys.argv[2]) if len(sys.argv) > 2 else -1

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
print(f"rank {rank} pid {os.getpid()} mode {MODE if rank == ODD else 'even'}", flush=True)
heavy = torch.randn(256, 256)


def extra_work() -> None:
    for _ in range(40):  # about 0.2 s of CPU
        torch.mm(heavy, heavy)


while True:
    if rank == ODD and MODE == "sleep":
        time.sleep(0.2)
    if rank == ODD and MODE == "compute":
        extra_work()
    loss = model(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.01)  # every rank: a light step, as real data loading leaves gaps
