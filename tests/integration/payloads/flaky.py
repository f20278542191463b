"""A job for the restart tests (``--max-restarts``), run under torchrun: argv[1] picks it.

once R    rank R exits with code 1 in attempt 1 (SSHDDP_ATTEMPT), after the first
          all-reduce; every rank of a later attempt all-reduces and prints a JSON summary
always R  rank R exits with code 1 in every attempt, after the first all-reduce
loop R    every rank all-reduces every 0.1 s, forever (R is unused): a lost node fails them

Every rank first starts a DataLoader-like worker (a child process sleeping forever): a
restart must not leave it behind. Each rank prints ``attempt A rank R ready`` once the
world formed.
"""

import json
import multiprocessing
import os
import sys
import time

import torch
import torch.distributed as dist

MODE, FAILING = sys.argv[1], int(sys.argv[2])


def worker() -> None:
    while True:
        time.sleep(1)


def main() -> None:
    attempt = int(os.environ["SSHDDP_ATTEMPT"])
    child = multiprocessing.get_context("fork").Process(target=worker, daemon=False)
    child.start()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"attempt {attempt} rank {rank} ready", flush=True)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    while MODE == "loop":
        time.sleep(0.1)
        dist.all_reduce(t)
    if rank == FAILING and (MODE == "always" or attempt == 1):
        print(f"attempt {attempt} rank {rank} fails", flush=True)
        os._exit(1)
    dist.all_reduce(t)  # the failing rank's peers wait here: they stop with the restart
    summary = {"rank": rank, "world": world, "attempt": attempt, "sum": t.item()}
    print(json.dumps(summary), flush=True)
    dist.destroy_process_group()
    child.kill()


if __name__ == "__main__":
    main()
