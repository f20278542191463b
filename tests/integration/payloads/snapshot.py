"""The shape of PyTorch's DDP tutorial ``multinode.py``, without torch: every node loads
snapshot.pt from its working directory if it is there and starts at the epoch it holds;
with `save`, node 0 (global rank 0's) then writes the next epoch's snapshot.

Prints one JSON line: the node rank, the epoch it starts at and its working directory.
"""

import json
import os
import sys

NODE = int(os.environ["NODE_RANK"])
epoch = 0
if os.path.exists("snapshot.pt"):
    with open("snapshot.pt") as fh:
        epoch = json.load(fh)["epoch"]
print(json.dumps({"node": NODE, "start_epoch": epoch, "cwd": os.getcwd()}), flush=True)
if NODE == 0 and sys.argv[1:] == ["save"]:
    with open("snapshot.pt.tmp", "w") as fh:
        json.dump({"epoch": epoch + 1}, fh)
    os.replace("snapshot.pt.tmp", "snapshot.pt")
