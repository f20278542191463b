"""Writes outputs into the working directory for `sshddp fetch` (no torch import).

outputs.py MB   out/big.bin: MB megabytes of random bytes, different on every node;
                out/sub/node.txt naming the node; out/link, a symlink (fetch skips links)
"""

import os
import sys

os.makedirs("out/sub", exist_ok=True)
with open("out/big.bin", "wb") as fh:
    for _ in range(int(sys.argv[1])):
        fh.write(os.urandom(1 << 20))
with open("out/sub/node.txt", "w") as fh:
    fh.write("node " + os.environ["GROUP_RANK"])
if not os.path.lexists("out/link"):
    os.symlink("/etc/hostname", "out/link")
print("WROTE", flush=True)
