"""Resumes from what the previous run left in its working directory (no torch import).

Prints one JSON line: the run id that snapshot.txt held (the run that wrote it; null when
there is none), the checkpoint's bytes and the cwd. Then it writes its own run id into
snapshot.txt. With `first`, it also writes checkpoint.pt, which later runs only read.
"""

import json
import os
import sys

RUN = os.environ["SSHDDP_RUN_ID"]


def read(path):
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return fh.read()


print(
    json.dumps(
        {
            "found": read("snapshot.txt"),
            "checkpoint": read("checkpoint.pt"),
            "cwd": os.getcwd(),
            "run": RUN,
        }
    )
)
if sys.argv[1:] == ["first"]:
    with open("checkpoint.pt", "w") as fh:
        fh.write("weights of " + RUN)
with open("snapshot.txt.tmp", "w") as fh:
    fh.write(RUN)
os.replace("snapshot.txt.tmp", "snapshot.txt")
