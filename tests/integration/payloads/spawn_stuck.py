"""mp.spawn workers that all-reduce every step, one of them stuck: for the watchdog's blame
under ``--launcher node``.

Usage: spawn_stuck.py NODE:LOCAL. Every worker joins the gloo group (its global rank is
NODE_RANK * NPROC_PER_NODE + local), prints "READY <rank>", then all-reduces in a loop and
prints nothing more; the worker LOCAL of node NODE stops after 3 steps in time.sleep
(stuck_worker), while the others wait in their next all-reduce.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def stuck_worker() -> None:
    while True:
        time.sleep(3600)  # STUCK HERE


def worker(local: int, node: int, nproc: int, world: int, stuck: str) -> None:
    rank = node * nproc + local
    dist.init_process_group("gloo", rank=rank, world_size=world)
    print(f"READY {rank}", flush=True)
    for step in range(10**9):
        if step == 3 and stuck == f"{node}:{local}":
            stuck_worker()
        dist.all_reduce(torch.ones(4))  # WAITS HERE


def main() -> None:
    node = int(os.environ["NODE_RANK"])
    nproc = int(os.environ["NPROC_PER_NODE"])
    world = int(os.environ["WORLD_SIZE"])
    mp.spawn(worker, args=(node, nproc, world, sys.argv[1]), nprocs=nproc)


if __name__ == "__main__":
    main()
