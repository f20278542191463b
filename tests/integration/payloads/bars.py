"""Every rank draws a real tqdm bar over one epoch of all-reduces (gloo), to stderr.

argv: STEPS PAUSE [GATE_DIR]. With GATE_DIR, the ranks stop at step 3 until GATE_DIR/3
exists, and at step 6 until GATE_DIR/6 does: the test reads the screen while every bar is
partway. Then each rank prints ``rank R epoch done`` on stdout. On a terminal (--tty), each
rank prints ``rank R size COLSxROWS`` at the start and after each gate.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from tqdm import tqdm

STEPS, PAUSE = int(sys.argv[1]), float(sys.argv[2])
GATES = sys.argv[3] if len(sys.argv) > 3 else None

dist.init_process_group("gloo")
rank = dist.get_rank()


def say_size() -> None:
    if sys.stderr.isatty():
        size = os.get_terminal_size(sys.stderr.fileno())
        tqdm.write(f"rank {rank} size {size.columns}x{size.lines}")  # clears the bar first


say_size()
total = torch.zeros(1)
for step in tqdm(range(STEPS), desc=f"rank{rank}", mininterval=0, miniters=1):
    if GATES is not None and step in (3, 6):
        while not os.path.exists(os.path.join(GATES, str(step))):
            time.sleep(0.1)
        say_size()
    total += 1
    dist.all_reduce(total)
    time.sleep(PAUSE)
print(f"rank {rank} epoch done", flush=True)
dist.barrier()
dist.destroy_process_group()
