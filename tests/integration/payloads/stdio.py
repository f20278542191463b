"""Rank output without any flush: what a plain `print` does under sshddp.

lines N SIZE   print "tty <isatty>" then N lines of SIZE bytes each, with no flush, as fast
               as it can, every rank of the node at once (a file barrier in the working
               directory lines them up) so that their lines would collide
live           print LIVE with no flush, then sleep until stopped
stubborn       ignore SIGTERM, print STUBBORN, sleep forever (only SIGKILL ends it)
junk MB        write MB megabytes of deterministic binary junk (NULs, CRs, invalid UTF-8,
               newlines at random) in one burst, then a last line without a newline
"""

import os
import random
import signal
import sys
import time


def junk(mb: int) -> bytes:
    """The bytes `junk MB` writes (the test computes them the same way)."""
    return random.Random(mb).randbytes(mb << 20) + b"tail without a newline"


rank = int(os.environ["RANK"])
if sys.argv[1] == "lines":
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
    print(f"LIVE {rank}")
    while True:
        time.sleep(1)
elif sys.argv[1] == "junk":
    sys.stdout.buffer.write(junk(int(sys.argv[2])))
    sys.stdout.buffer.flush()
elif sys.argv[1] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"STUBBORN {rank}")
    while True:
        time.sleep(1)
