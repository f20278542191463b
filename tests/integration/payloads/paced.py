"""Each rank draws a tqdm bar, stepping on its own (no collective per step, so no rank waits
for another): every rank steps every STEP seconds, rank SLOW_RANK five times slower. It runs
until it is stopped."""

from __future__ import annotations

import os
import sys
import time

import torch.distributed as dist
from tqdm import tqdm

STEP = 0.04
SLOW_RANK = int(sys.argv[1]) if len(sys.argv) > 1 else 4

dist.init_process_group("gloo")
rank = dist.get_rank()
pause = STEP * (5 if rank == SLOW_RANK else 1)
print(f"rank {rank} pid {os.getpid()} steps every {pause} s", flush=True)
for _ in tqdm(range(10**7), desc=f"rank {rank}", mininterval=0.2):
    time.sleep(pause)
