"""The job ``sshddp smoke`` ships and runs under torchrun on every host (it needs torch).

Every rank joins (NCCL on GPUs, gloo on CPU) and says where it runs; an all-reduce of
``rank + 1`` in int64 must give exactly ``n (n + 1) / 2``; then the all-reduce of float32
tensors of each size is timed (algorithm bandwidth = bytes / time, bus bandwidth = algbw
* 2 (n - 1) / n, as nccl-tests define them, from the slowest rank's time), and each node's
own link to node 0: its local rank 0 and global rank 0 send and receive ``--p2p-bytes``
back and forth. Rank 0 prints one JSON line: ``{"sshddp_smoke": 1, ...}``.

Usage: smoke.py [--sizes B,B,...] [--iters N] [--warmup N] [--p2p-bytes B] [--timeout S]
Standalone: it imports nothing of sshddp.
"""

import argparse
import datetime
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

SMOKE_RECORD = "sshddp_smoke"
CPU_SIZES = [1 << k for k in range(10, 25, 2)]  # 1 KiB .. 16 MiB
GPU_SIZES = [1 << k for k in range(10, 29, 2)]  # 1 KiB .. 256 MiB


def _device() -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _joined(device: torch.device) -> list:
    """Every rank's (rank, node, local rank, host), gathered everywhere."""
    me = {
        "rank": dist.get_rank(),
        "node": int(os.environ.get("GROUP_RANK", "0")),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "host": socket.gethostname(),
    }
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, me)
    return everyone


def _exact_sum(device: torch.device) -> int:
    total = torch.tensor([dist.get_rank() + 1], dtype=torch.int64, device=device)
    dist.all_reduce(total)
    return int(total.item())


def _time_allreduce(size: int, iters: int, warmup: int, device: torch.device) -> dict:
    n = dist.get_world_size()
    data = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(data)
    _sync(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(data)
    _sync(device)
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
    elapsed = elapsed.to(device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
    seconds = float(elapsed.item())
    algbw = data.numel() * 4 / seconds / 1e9
    return {
        "bytes": data.numel() * 4,
        "time_us": seconds * 1e6,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * 2 * (n - 1) / n,
    }


def _p2p(nodes: list, size: int, iters: int, device: torch.device) -> list:
    """Each node's first rank and rank 0 ping-pong ``size`` bytes; that node's GB/s."""
    me = dist.get_rank()
    data = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
    found = []
    for node, peer in nodes:
        if node == 0:
            continue
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters if me in (0, peer) else 0):
            if me == 0:
                dist.send(data, peer)
                dist.recv(data, peer)
            else:
                dist.recv(data, 0)
                dist.send(data, 0)
        _sync(device)
        seconds = time.perf_counter() - start
        if me == 0:
            found.append({"node": node, "rank": peer, "gbps": 2 * iters * size / seconds / 1e9})
    return found


def main(argv: list) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--p2p-bytes", type=int, default=4 << 20)
    p.add_argument("--timeout", type=float, default=120.0)
    args = p.parse_args(argv)
    device = _device()
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    joined = _joined(device)
    total = _exact_sum(device)
    sizes = [int(s) for s in args.sizes.split(",") if s] or (
        GPU_SIZES if device.type == "cuda" else CPU_SIZES
    )
    results = [_time_allreduce(s, args.iters, args.warmup, device) for s in sizes]
    firsts = sorted({(j["node"], j["rank"]) for j in joined if j["local_rank"] == 0})
    links = _p2p(firsts, args.p2p_bytes, max(2, args.iters // 2), device)
    if dist.get_rank() == 0:
        n = dist.get_world_size()
        record = {
            SMOKE_RECORD: 1,
            "backend": backend,
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "world_size": n,
            "joined": joined,
            "sum": total,
            "expected_sum": n * (n + 1) // 2,
            "allreduce": results,
            "p2p_bytes": args.p2p_bytes,
            "p2p": links,
        }
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
