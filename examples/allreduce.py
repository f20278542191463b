"""A minimal distributed job: every rank all-reduces its rank number and checks the sum.

Runs on GPUs with NCCL when CUDA is available, else on CPU with gloo. Prints one JSON line
per rank so tests (and people) can check ranks, hosts and arguments.
"""

import json
import os
import socket
import sys

import torch
import torch.distributed as dist


def main() -> None:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else None
    if device is not None:
        torch.cuda.set_device(device)
    value = torch.tensor([float(rank)], device=device)
    dist.all_reduce(value)
    expected = world * (world - 1) / 2
    print(
        json.dumps(
            {
                "rank": rank,
                "world": world,
                "local_rank": int(os.environ["LOCAL_RANK"]),
                "node_rank": int(os.environ["GROUP_RANK"]),
                "host": socket.gethostname(),
                "backend": backend,
                "sum": value.item(),
                "ok": value.item() == expected,
                "argv": sys.argv[1:],
            }
        ),
        flush=True,
    )
    dist.destroy_process_group()
    if value.item() != expected:
        sys.exit(1)


if __name__ == "__main__":
    main()
