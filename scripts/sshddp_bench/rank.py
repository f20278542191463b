"""The rank program every case runs, written into the suite's temporary directory.

It prints ``READY <rank> <time>`` at import, before torch or any process group, so launch
latency measures the launcher and not the training script; then it does what its first
argument says:

* ``latency``: sleeps 1 s and exits 0;
* ``teardown``: the last rank prints ``FAIL <time>`` after 1 s and raises, the others sleep;
* ``sleep``: sleeps 300 s (the node-loss runs signal it first);
* ``initblock``: node 1's ranks sleep 300 s, the others wait in gloo's init_process_group;
* ``flood MB [all]``: rank 0 (every rank with ``all``) writes MB MiB of 64-byte lines
  between a ``START <time>`` and an ``END <time>`` line;
* ``restart``: in the first attempt (``SSHDDP_ATTEMPT``, else torchrun's
  ``TORCHELASTIC_RESTART_COUNT``) the last rank prints ``FAIL <time>`` after 1 s and exits
  1, the others sleep; in a later one every rank prints ``AGAIN <rank> <time>`` at once,
  then sleeps 1 s and exits 0;
* ``replace [fail]``: in the first attempt rank 0 writes ``ckpt.bin`` (1 MiB: the
  ``--share`` file) and every rank sleeps (with ``fail``, the last rank prints ``FAIL
  <time>`` after 1 s and exits 1); in a later one every rank prints ``AGAIN <rank>
  <time>`` at once, joins gloo's process group, prints ``JOINED <rank> <time>``, then
  leaves it and exits 0;
* ``steps N``: gloo's process group, then N steps of a 256x256 matmul and an all-reduce
  of 64 Ki floats, after 20 untimed ones; rank 0 prints ``STEPS <steps per second>``;
* ``print RATE SECONDS``: each rank prints RATE lines a second for SECONDS, one flushed
  write a line, paced against the clock (RATE 0: prints nothing, sleeps SECONDS).
"""

from __future__ import annotations

# 64 bytes a line, so 1 MiB is exactly 16384 lines.
LINE = b"sshddp benchmark log line ".ljust(63, b".") + b"\n"

RANK_SCRIPT = f'''\
"""sshddp benchmark rank: READY at import, then latency / teardown / sleep / flood / replace /
steps / print (see sshddp_bench/rank.py)."""
import os
import sys
import time

rank = int(os.environ.get("RANK", "0"))
world = int(os.environ.get("WORLD_SIZE", "1"))
print("READY %d %.6f" % (rank, time.time()), flush=True)
mode = sys.argv[1]
if mode == "latency":
    time.sleep(1.0)
elif mode == "teardown":
    if rank == world - 1:
        time.sleep(1.0)
        print("FAIL %.6f" % time.time(), flush=True)
        raise RuntimeError("injected failure (benchmark)")
    time.sleep(300)
elif mode == "sleep":
    time.sleep(300)
elif mode == "initblock":
    if os.environ.get("GROUP_RANK") == "1":
        time.sleep(300)
    import torch.distributed as dist

    dist.init_process_group("gloo")
    time.sleep(300)
elif mode == "restart":
    attempt = os.environ.get("SSHDDP_ATTEMPT")
    if attempt is None:
        attempt = str(int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) + 1)
    if attempt != "1":
        print("AGAIN %d %.6f" % (rank, time.time()), flush=True)
        time.sleep(1.0)
    elif rank == world - 1:
        time.sleep(1.0)
        print("FAIL %.6f" % time.time(), flush=True)
        sys.exit(1)
    else:
        time.sleep(300)
elif mode == "replace" and os.environ.get("SSHDDP_ATTEMPT", "1") == "1":
    if rank == 0:
        with open("ckpt.bin", "wb") as fh:
            fh.write(os.urandom(1 << 20))
    if sys.argv[2:] == ["fail"] and rank == world - 1:
        time.sleep(1.0)
        print("FAIL %.6f" % time.time(), flush=True)
        sys.exit(1)
    time.sleep(300)
elif mode == "replace":
    print("AGAIN %d %.6f" % (rank, time.time()), flush=True)
    import torch.distributed as dist

    dist.init_process_group("gloo")
    print("JOINED %d %.6f" % (rank, time.time()), flush=True)
    dist.barrier()
    dist.destroy_process_group()
elif mode == "flood" and (rank == 0 or sys.argv[3:] == ["all"]):
    chunk = {LINE!r} * (1 << 20 >> 6)
    out = sys.stdout.buffer
    print("START %.6f" % time.time(), flush=True)
    for _ in range(int(sys.argv[2])):
        out.write(chunk)
    out.flush()
    print("END %.6f" % time.time(), flush=True)
elif mode == "steps":
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # the same on both sides, and no oversubscription of 2 cores
    dist.init_process_group("gloo")
    a, grad = torch.randn(256, 256), torch.ones(1 << 16)
    for step in range(20 + int(sys.argv[2])):
        if step == 20:
            dist.barrier()
            t0 = time.perf_counter()
        a = torch.tanh(a @ a)
        dist.all_reduce(grad)
        grad.div_(world)
    dist.barrier()
    if rank == 0:
        print("STEPS %.3f" % (int(sys.argv[2]) / (time.perf_counter() - t0)), flush=True)
    dist.destroy_process_group()
elif mode == "print":
    rate, count = int(sys.argv[2]), int(int(sys.argv[2]) * float(sys.argv[3]))
    t0 = time.time()
    if rate == 0:
        time.sleep(float(sys.argv[3]))
    for i in range(count):
        print("relay %d %d %.6f" % (rank, i, time.time()), flush=True)
        ahead = t0 + (i + 1) / rate - time.time()
        if ahead > 0:
            time.sleep(ahead)
'''
