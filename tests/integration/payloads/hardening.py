"""The job the hardening tests run under torchrun: behaviour picked by argv[1]. It never
imports torch (the tests need no collective), so a run starts in a second.

wait            print READY <rank> and sleep forever (to be stopped)
until FILE [R]  print READY <rank>, wait for FILE to exist; then rank R raises and every
                other rank sleeps forever (with no R, every rank exits 0)
escape          rank 0 starts `setsid env -i sleep 600` holding the node's output (it leaves
                the session and the environment, so teardown cannot find it), prints
                ESCAPED <pid>, and every rank exits 0
long N SIZE     print N lines of SIZE characters each, then exit 0
"""

import os
import subprocess
import sys
import time

MODE = sys.argv[1]
ARGS = sys.argv[2:]
RANK = int(os.environ["RANK"])


def forever() -> None:
    while True:
        time.sleep(1)


def until(path: str, failing: "int | None") -> None:
    print(f"READY {RANK}", flush=True)
    while not os.path.exists(path):
        time.sleep(0.05)
    if failing is None:
        return
    if failing == RANK:
        raise RuntimeError(f"boom on rank {RANK}")
    forever()


def escape() -> None:
    if RANK == 0:
        child = subprocess.Popen(["setsid", "env", "-i", "sleep", "600"])
        print(f"ESCAPED {child.pid}", flush=True)


def long_lines(count: int, size: int) -> None:
    for i in range(count):
        head = f"rank {RANK} line {i} "
        print(head + "x" * (size - len(head) - 4) + " end")


def main() -> None:
    if MODE == "wait":
        print(f"READY {RANK}", flush=True)
        forever()
    elif MODE == "until":
        until(ARGS[0], int(ARGS[1]) if len(ARGS) > 1 else None)
    elif MODE == "escape":
        escape()
    elif MODE == "long":
        long_lines(int(ARGS[0]), int(ARGS[1]))
    else:
        sys.exit(f"unknown mode {MODE}")


if __name__ == "__main__":
    main()
