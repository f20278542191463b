"""A rank that prints READY and waits to be stopped, without importing torch (fast)."""

import os
import time

print(f"READY {os.environ['RANK']}", flush=True)
while True:
    time.sleep(1)
