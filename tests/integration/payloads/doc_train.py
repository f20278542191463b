"""The docs' ``train.py`` (and ``old_train.py``, ``train_spawn.py``, ...) on the test hosts,
for tests/integration/test_docs_examples.py: takes whatever arguments the doc gives it,
leaves ``checkpoint.pt`` and ``outputs/`` in its working directory for ``sshddp fetch``,
and with ``--live SECONDS`` stays that long (a run to attach to, take stacks of, stop)."""

from __future__ import annotations

import os
import sys
import time


def _write(path: str, data: str) -> None:
    # Every rank of a host writes the same file in the same directory: whole or not at all.
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(data)
    os.replace(tmp, path)


def main(args: list[str]) -> None:
    rank = os.environ.get("RANK", os.environ.get("NODE_RANK", "0"))
    print(f"rank {rank}: {' '.join(args)}", flush=True)
    os.makedirs("outputs", exist_ok=True)
    _write("checkpoint.pt", f"weights of rank {rank}\n")
    _write(os.path.join("outputs", "metrics.txt"), "loss 0.1\n")
    print(f"rank {rank}: ready", flush=True)  # its files are there: fetch may copy them
    live = float(args[args.index("--live") + 1]) if "--live" in args else 0.0
    deadline = time.monotonic() + live
    while time.monotonic() < deadline:
        time.sleep(0.2)
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
