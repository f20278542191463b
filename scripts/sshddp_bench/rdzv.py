"""torch's two rendezvous backends, as torchrun runs them: from the last node's torch
import to the first rank's line, two nodes on this machine, one started late.

``python -m sshddp_bench.rdzv [--reps N] [--delays S,S,..]``. Each node is a real
``torchrun`` (``--nnodes 2 --nproc-per-node 1``) on 127.0.0.1 whose import of torch is
timed from inside its own interpreter; a rank prints its time at start. sshddp's plan uses
the static backend (docs/hangs.md, *Restarts*); this shows what the c10d backend would cost: a
node that joined before the last one polls torch's store once a second
(``dynamic_rendezvous``'s ``_delay(seconds=1)``), so the ranks start up to a second after
the last node is ready. With the static backend, node 0 serves the store: when node 0 is
the late one, the other node's connect waits between tries, longer each time, and the
last rows time that through plain torchrun and through sshddp's agent shim, whose nodes
try the store every 10 ms before torchrun runs (``remote/rankside/agent.py``, docs/design.md *How a
launch works*, step 4). Not a case of the suite: it measures torch, and that one wait of sshddp's.
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
if sys.argv[1] == "shim":  # sshddp's agent shim, from here on as it runs on a node
    sys.argv[:2] = ["agent.py"]
    import agent
    agent.main()
del sys.modules["torch.distributed.run"]
sys.argv[:2] = ["torchrun"]
runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
"""
RANK = 'import time\nprint("RANK %.6f" % time.time(), flush=True)\n'


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def once(tmp: Path, backend: str, delay: float, late: int = 1, via: str = "torchrun") -> float:
    """Seconds from the later node's import to the first rank's line; node ``late`` starts
    ``delay`` seconds after the other, through ``via`` (torchrun, or sshddp's agent shim)."""
    port = free_port()
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", backend]
    common += ["--rdzv-endpoint", f"127.0.0.1:{port}"]  # as sshddp's plan gives it
    if backend != "static":
        common += ["--rdzv-id", f"r{port}"]
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    procs = []
    for rank in (1 - late, late):
        if rank == late:
            time.sleep(delay)
        argv = [sys.executable, str(tmp / "node.py"), via, *common]
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
        (tmp / "agent.py").write_text(agent_source())
        print(
            "| backend | node started late | started after (s) | through "
            "| last import → first rank (s) |"
        )
        print("|---|---:|---:|---|---|")
        rows = [("static", 1, "torchrun"), ("c10d", 1, "torchrun")]
        rows += [("static", 0, "torchrun"), ("static", 0, "shim")]
        for backend, late, via in rows:
            for delay in delays:
                runs = [once(tmp, backend, delay, late, via) for _ in range(args.reps)]
                cell = f"{statistics.median(runs):.2f} ({min(runs):.2f}–{max(runs):.2f})"
                name = "sshddp's agent shim" if via == "shim" else via
                print(f"| {backend} | {late} | {delay:g} | {name} | {cell} |", flush=True)


def agent_source() -> str:
    """sshddp's agent shim, as a launch writes it into a node's run directory."""
    from sshddp.hosts import shipped

    return shipped.source("sshddp.remote.rankside.agent")


if __name__ == "__main__":
    main()
