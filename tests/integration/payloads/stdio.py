"""Rank output without any flush: what a plain `print` does under sshddp.

lines N SIZE   print "tty <isatty>" then N lines of SIZE bytes each, with no flush, as fast
               as it can, every rank of the node at once (a file barrier in the working
               directory lines them up) so that their lines would collide
live           print LIVE with no flush, then sleep until stopped
"""

import os
import sys
import time

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
