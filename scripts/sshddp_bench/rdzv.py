"""torch's two rendezvous backends, as torchrun runs them: from the last node's torch
import to the first rank's line, two nodes on this machine, the second started late.

``python -m sshddp_bench.rdzv [--reps N] [--delays S,S,..]``. Each node is a real
``torchrun`` (``--nnodes 2 --nproc-per-node 1``) on 127.0.0.1 whose import of torch is
timed from inside its own interpreter; a rank prints its time at start. sshddp's plan uses
the static backend (README, *Restarts*); this shows what the c10d backend would cost: a
node that joined before the last one polls torch's store once a second
(``dynamic_rendezvous``'s ``_delay(seconds=1)``), so the ranks start up to a second after
the last node is ready. Not a case of the suite: it measures torch, not sshddp.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NODE = """\
import runpy, sys, time
import torch.distributed.run
print("IMPORTED %.6f" % time.time(), flush=True)
del sys.modules["torch.distributed.run"]
sys.argv = ["torchrun"] + sys.argv[1:]
runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
"""
RANK = 'import time\nprint("RANK %.6f" % time.time(), flush=True)\n'


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def once(tmp: Path, backend: str, delay: float) -> float:
    """Seconds from the later node's import to the first rank's line."""
    port = free_port()
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", backend]
    if backend == "static":
        common += ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    else:
        common += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"r{port}"]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    procs = []
    for rank in (0, 1):
        if rank == 1:
            time.sleep(delay)
        argv = [sys.executable, str(tmp / "node.py"), *common]
        if backend == "static":  # (c10d assigns node ranks itself)
            argv += ["--node-rank", str(rank)]
        argv.append(str(tmp / "rank.py"))
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
    out = "".join(p.communicate(timeout=120)[0] for p in procs)
    imported = [float(t) for t in re.findall(r"IMPORTED (\S+)", out)]
    ranks = [float(t) for t in re.findall(r"RANK (\S+)", out)]
    if len(imported) != 2 or len(ranks) != 2:
        raise SystemExit(f"{backend}: unexpected output:\n{out}")
    return min(ranks) - max(imported)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m sshddp_bench.rdzv", description=__doc__)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--delays", default="0,0.3,0.6", help="seconds between the two nodes")
    args = p.parse_args()
    delays = [float(x) for x in args.delays.split(",")]
    with tempfile.TemporaryDirectory(prefix="sshddp-rdzv-") as name:
        tmp = Path(name)
        (tmp / "node.py").write_text(NODE)
        (tmp / "rank.py").write_text(RANK)
        print("| backend | second node started after (s) | last import → first rank (s) |")
        print("|---|---:|---|")
        for backend in ("static", "c10d"):
            for delay in delays:
                runs = [once(tmp, backend, delay) for _ in range(args.reps)]
                cell = f"{statistics.median(runs):.2f} ({min(runs):.2f}–{max(runs):.2f})"
                print(f"| {backend} | {delay:g} | {cell} |", flush=True)


if __name__ == "__main__":
    main()
