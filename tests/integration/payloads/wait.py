"""A rank that prints READY and waits to be stopped, without importing torch (fast).

``wait.py fail R``: rank R raises a second after its READY line instead.
"""

import os
import sys
import time

rank = int(os.environ["RANK"])
print(f"READY {rank}", flush=True)
if sys.argv[1:2] == ["fail"] and rank == int(sys.argv[2]):
    time.sleep(1)
    raise RuntimeError(f"boom on rank {rank}")
while True:
    time.sleep(1)
