"""A real NCCL job for scripts/gpu_smoke.sh: one all-reduce per rank on its own GPU.

--fail: raise while holding GPU memory. --hang: enqueue a second all-reduce behind a kernel
that spins for minutes, then wait in silence: NCCL's collective never completes, as when a
rank never joins it (the watchdog's --stall-timeout and the flight recorder's dump).
--alone: form the NCCL world, then compute on the GPU without a collective, as accelerate
does on hosts it was not told to use together (the report's "not distributed" warning);
its ranks may share one GPU, since NCCL makes no communicator without a collective."""

import os
import sys
import time

import torch
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank % torch.cuda.device_count())
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
if "--alone" in sys.argv:
    x = torch.randn(1024, 1024, device="cuda")
    print(f"rank {rank}/{world} alone: {(x @ x).abs().mean().item():.3f}", flush=True)
    sys.exit(0)
t = torch.tensor([float(rank + 1)], device="cuda")
dist.all_reduce(t)
hold = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")  # visible to nvidia-smi
print(
    f"rank {rank}/{world} on {torch.cuda.get_device_name()} nccl {torch.cuda.nccl.version()}"
    f" all_reduce={t.item():g} expected={world * (world + 1) / 2:g} argv={sys.argv[1:]}",
    flush=True,
)
if "--hang" in sys.argv:
    torch.cuda._sleep(10**13)  # the stream spins: the next collective cannot complete
    dist.all_reduce(t)
    time.sleep(600)
if "--fail" in sys.argv:
    raise RuntimeError(f"planned failure on rank {rank} while holding GPU memory")
dist.destroy_process_group()
