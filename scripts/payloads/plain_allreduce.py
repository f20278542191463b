"""A plain torchrun all-reduce benchmark: the baseline of ``sshddp smoke``'s figures.

The same all-reduces as sshddp/jobs/smoke.py (float32, warm-up, a barrier, ``--iters``
timed, the slowest rank's mean time), with nothing else: rank 0 prints one JSON line per
size, ``{"plain": 1, "bytes", "busbw_gbps"}``. Usage: plain_allreduce.py SIZES ITERS WARMUP
"""

import json
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    sizes = [int(s) for s in sys.argv[1].split(",")]
    iters, warmup = int(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("gloo")
    n = dist.get_world_size()
    for size in sizes:
        data = torch.ones(size // 4, dtype=torch.float32)
        for _ in range(warmup):
            dist.all_reduce(data)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(data)
        elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        busbw = size / elapsed.item() / 1e9 * 2 * (n - 1) / n
        if dist.get_rank() == 0:
            print(json.dumps({"plain": 1, "bytes": size, "busbw_gbps": busbw}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
