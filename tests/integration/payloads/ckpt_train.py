"""A DDP-like job that checkpoints and resumes, for the spares' mid-run tests (gloo, CPU).

ckpt_train.py STEPS [FAULT RANK TRIGGER]: every rank all-reduces once a step (0.2 s apart);
rank 0 writes ckpt.json (the next step, atomically) every 3 steps. A rank starts from
ckpt.json's step when the file is there (the script's ordinary "load the checkpoint if it
exists"), and prints ``attempt A rank R node N replaced [X] starts at step S`` and
``attempt A rank R python PATH`` (its interpreter), then ``rank R step S`` each step, then
a JSON summary once STEPS steps are done. With FAULT, rank RANK fails in attempt 1 once
past step 7 and once the test made the file TRIGGER: ``ecc`` prints CUDA's uncorrectable
ECC error to stderr and exits 1 (as a rank whose GPU failed), ``raise`` raises a plain
ValueError (the user's code).
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

STEPS = int(sys.argv[1])
FAULT, FAULTY, TRIGGER = (
    (sys.argv[2], int(sys.argv[3]), sys.argv[4]) if len(sys.argv) > 4 else ("", -1, "")
)
CKPT = "ckpt.json"


def start_step() -> int:
    try:
        with open(CKPT) as fh:
            return int(json.load(fh)["step"])
    except (OSError, ValueError, KeyError):
        return 0


def save(step: int) -> None:
    with open(CKPT + ".tmp", "w") as fh:
        json.dump({"step": step}, fh)
    os.replace(CKPT + ".tmp", CKPT)


def fault(attempt: str, rank: int, step: int) -> None:
    """Rank FAULTY's failure in attempt 1, past step 7, once the test says so."""
    if attempt != "1" or rank != FAULTY or step < 8 or not os.path.exists(TRIGGER):
        return
    if FAULT == "ecc":
        print("RuntimeError: CUDA error: uncorrectable ECC error encountered", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
    if FAULT == "raise":
        raise ValueError(f"rank {rank} fails in its own code")


def main() -> None:
    attempt, node = os.environ["SSHDDP_ATTEMPT"], os.environ["SSHDDP_NODE_RANK"]
    replaced = os.environ.get("SSHDDP_REPLACED", "")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    first = start_step()
    print(f"attempt {attempt} rank {rank} node {node} replaced [{replaced}] starts at step {first}")
    print(f"attempt {attempt} rank {rank} python {sys.executable}", flush=True)
    t = torch.tensor([0.0])
    for step in range(first, STEPS):
        fault(attempt, rank, step)
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        print(f"rank {rank} step {step}", flush=True)
        if rank == 0 and step % 3 == 2:
            save(step + 1)
        time.sleep(0.2)
    summary = {"rank": rank, "world": world, "attempt": int(attempt), "first": first}
    print(json.dumps({**summary, "sum": t.item()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
