"""Each rank prints the variables torchrun and sshddp set for it, as one JSON line."""

import json
import os

NAMES = ("RANK", "WORLD_SIZE", "GROUP_RANK", "NODE_RANK")
print(json.dumps({k: os.environ.get(k) for k in NAMES}))
