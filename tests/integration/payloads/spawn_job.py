"""A standalone trainer that spawns its own workers with torch.multiprocessing.spawn.

Written the way such scripts are written for a node-level launcher: one process per node,
which reads NODE_RANK, NPROC_PER_NODE, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the
environment and computes each worker's global rank as NODE_RANK * NPROC_PER_NODE + local.

Usage: spawn_job.py [--fail NODE:LOCAL] [--sleeper] [--hold SECONDS]
  --fail NODE:LOCAL  that worker raises once every worker has joined; the others wait 30 s
                     outside any collective (in one, they would fail at the same moment
                     with "Connection closed by peer"), then until teardown
  --sleeper          every worker first starts `sleep 600` in a session of its own (setsid),
                     which only the node's run marker can find at teardown
  --hold SECONDS     every worker sleeps that long after training (a run to stop)
"""

import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def emit(record: dict) -> None:
    sys.stdout.write(json.dumps(record) + "\n")  # one write: whole lines in the node's pipe
    sys.stdout.flush()


def worker(
    local: int, node: int, nproc: int, world: int, fail: str, sleeper: bool, hold: float
) -> None:
    rank = node * nproc + local
    if sleeper:
        child = subprocess.Popen(["sleep", "600"], start_new_session=True)
        emit({"sleeper": child.pid, "rank": rank})
    dist.init_process_group("gloo", rank=rank, world_size=world)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    if fail == f"{node}:{local}":
        raise RuntimeError(f"worker {local} of node {node} failed on purpose")
    if fail:  # the others wait outside any collective: the failure comes first, alone
        time.sleep(30)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(rank)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
    weights = model.module.weight.detach().clone()
    reference = weights.clone()
    dist.broadcast(reference, 0)
    emit(
        {
            "spawn": True,
            "rank": rank,
            "local_rank": local,
            "node_rank": node,
            "world_size": world,
            "sum": total.item(),
            "weights_agree": bool(torch.equal(weights, reference)),
        }
    )
    time.sleep(hold)
    dist.destroy_process_group()


def main() -> None:
    args = sys.argv[1:]
    fail = args[args.index("--fail") + 1] if "--fail" in args else ""
    node = int(os.environ["NODE_RANK"])
    nproc = int(os.environ["NPROC_PER_NODE"])
    world = int(os.environ["WORLD_SIZE"])
    hold = float(args[args.index("--hold") + 1]) if "--hold" in args else 0.0
    mp.spawn(worker, args=(node, nproc, world, fail, "--sleeper" in args, hold), nprocs=nproc)


if __name__ == "__main__":
    main()
