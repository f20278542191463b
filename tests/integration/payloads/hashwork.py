"""A job that reads its workdir: one JSON line, the SHA-256 of every file under data/."""

import hashlib
import json
import os

digests = {}
for name in sorted(os.listdir("data")):
    with open(os.path.join("data", name), "rb") as fh:
        digests[name] = hashlib.sha256(fh.read()).hexdigest()
print(json.dumps({"cwd": os.getcwd(), "data": digests}), flush=True)
