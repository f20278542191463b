"""Rank output without any flush: what a plain `print` does under sshddp.

lines N SIZE   print "tty <isatty>" then N lines of SIZE bytes each, with no flush, as fast
               as it can, every rank of the node at once (a file barrier in the working
               directory lines them up) so that their lines would collide
live           print LIVE with no flush, then sleep until stopped
stubborn       ignore SIGTERM, print STUBBORN, sleep forever (only SIGKILL ends it)
junk MB        write MB megabytes of deterministic binary junk (NULs, CRs, invalid UTF-8,
               newlines at random) in one burst, then a last line without a newline
spawned N SIZE start two workers as fresh interpreters (multiprocessing's spawn, as
               mp.spawn and Lightning do, and a `python SCRIPT worker` subprocess), each printing
               "SPAWNED <rank> <how>" with no flush, then N lines of SIZE bytes, then sleeping
               until stopped
"""

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time


def junk(mb: int) -> bytes:
    """The bytes `junk MB` writes (the test computes them the same way)."""
    return random.Random(mb).randbytes(mb << 20) + b"tail without a newline"


def worker(rank: int, how: str, count: int, size: int) -> None:
    """A spawned worker: a fresh interpreter, stdout a pipe, no flush anywhere."""
    print(f"SPAWNED {rank} {how}")
    for i in range(count):
        head = f"w{rank}{how[0]} {i:06d} "
        print(head + "x" * (size - len(head) - 1))
    while True:
        time.sleep(1)


if __name__ != "__main__":  # imported by a spawned worker to find `worker`
    pass
elif sys.argv[1] == "spawned":
    rank, count, size = int(os.environ["RANK"]), int(sys.argv[2]), int(sys.argv[3])
    child = multiprocessing.get_context("spawn").Process(
        target=worker, args=(rank, "mp", count, size)
    )
    child.start()
    argv = [sys.executable, __file__, "worker", str(rank), str(count), str(size)]
    subprocess.Popen(argv)
    while True:
        time.sleep(1)
elif sys.argv[1] == "worker":  # the `python` subprocess of `spawned`
    worker(int(sys.argv[2]), "py", int(sys.argv[3]), int(sys.argv[4]))
elif sys.argv[1] == "lines":
    rank = int(os.environ["RANK"])
    count, size = int(sys.argv[2]), int(sys.argv[3])
    print(f"tty {sys.stdout.isatty()} rank {rank}")
    open(f"ready.{rank}", "w").close()
    local = int(os.environ["LOCAL_WORLD_SIZE"])
    while sum(os.path.exists(f"ready.{r}") for r in range(local)) < local:
        time.sleep(0.001)
    for i in range(count):
        head = f"r{rank} {i:06d} "
        print(head + chr(ord("a") + rank % 26) * (size - len(head) - 1))
elif sys.argv[1] == "live":
    rank = int(os.environ["RANK"])
    print(f"LIVE {rank}")
    while True:
        time.sleep(1)
elif sys.argv[1] == "junk":
    sys.stdout.buffer.write(junk(int(sys.argv[2])))
    sys.stdout.buffer.flush()
elif sys.argv[1] == "stubborn":
    rank = int(os.environ["RANK"])
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"STUBBORN {rank}")
    while True:
        time.sleep(1)
