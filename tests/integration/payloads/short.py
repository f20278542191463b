"""A short run for the soak test: each rank prints one JSON line and exits (no torch import)."""

import json
import os

print(json.dumps({k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "GROUP_RANK", "SSHDDP_RUN_ID")}))
