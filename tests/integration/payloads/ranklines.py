"""Every rank writes lines that name it, to stdout and stderr, from itself, from a DataLoader
worker and from a subprocess, with a long line and a short \\r progress bar; see
``expected`` in test_rank_output.py for exactly what each rank writes.

argv: LINES [GATE]. With GATE (a path), each rank writes its first half, then waits for GATE
to exist before it writes the rest: a test attaches while the run goes on.
"""

import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class Items(Dataset):
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:
        print(f"rank {self.rank} worker item {i}")  # in the worker process
        return i


def middle(rank: int) -> None:
    print(f"rank {rank} long " + "x" * 20000)
    for _ in DataLoader(Items(rank), num_workers=1, batch_size=None):
        pass
    cmd = [sys.executable, "-c", f"print('rank {rank} child')"]
    subprocess.run(cmd, check=True)
    for s in range(4):
        sys.stdout.write(f"rank {rank} bar {s}/3\r")
        sys.stdout.flush()
        time.sleep(0.15)  # past the supervisor's wait for the line's end: the bar is live
    print()


def main() -> None:
    lines = int(sys.argv[1])
    gate = sys.argv[2] if len(sys.argv) > 2 else None
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for i in range(lines):
        print(f"rank {rank} line {i}")
        print(f"rank {rank} err {i}", file=sys.stderr)
        if i == lines // 2:
            middle(rank)
            while gate and not os.path.exists(gate):
                time.sleep(0.05)
    dist.all_reduce(torch.ones(1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
