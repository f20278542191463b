"""sshddp.launch from a real Jupyter kernel (nbclient runs the notebook's cells)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable

import nbformat
from launch_helpers import wait_until, write_inventory
from nbclient import NotebookClient

from sshddp_lab.sshd import SshdCluster

DEFINE = """
import os

def hello(scale):
    print(f"hello from rank {os.environ['RANK']}", flush=True)
    return int(os.environ["RANK"]) * scale
"""

LAUNCH = """
import json
import sshddp

result = sshddp.launch(hello, {inv!r}, args=(3,))
print("VALUES " + json.dumps(result.values))
print("HOSTS " + json.dumps(sorted(result.by_host())))
"""


def test_a_notebook_cell_launches_and_prints_the_values(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    inv, _ = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2])
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(DEFINE),
        nbformat.v4.new_code_cell(LAUNCH.format(inv=str(inv))),
    ]
    client = NotebookClient(
        nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    text = "".join(
        o.get("text", "") for o in nb.cells[1].outputs if o.get("output_type") == "stream"
    )
    values = [ln for ln in text.splitlines() if ln.startswith("VALUES ")]
    assert values and json.loads(values[0][len("VALUES ") :]) == [0, 3, 6, 9], text
    hosts = [ln for ln in text.splitlines() if ln.startswith("HOSTS ")]
    assert json.loads(hosts[0][len("HOSTS ") :]) == sorted(
        [ssh_env.host(1).alias, ssh_env.host(2).alias]
    )
    assert "hello from rank 3" in text  # the ranks' output reached the cell
    run_id = next(ln.split()[2].rstrip(":") for ln in text.splitlines() if "sshddp: run " in ln)
    run_no_leak(run_id)


SLEEPER = """
import os, time, sshddp

def sleeper():
    print(f"sleeping rank {os.environ['RANK']}", flush=True)
    time.sleep(600)

try:
    sshddp.launch(sleeper, INVENTORY, name="nbint")
except KeyboardInterrupt:
    print("INTERRUPTED")
"""


def test_interrupt_kernel_stops_every_rank(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """The notebook's "interrupt kernel" (SIGINT to the kernel) stops the run on every host
    and reaches the cell as KeyboardInterrupt; nothing of the run is left."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2])
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(SLEEPER.replace("INVENTORY", repr(str(inv))))]
    client = NotebookClient(
        nb, kernel_name="python3", timeout=200, resources={"metadata": {"path": str(tmp_path)}}
    )
    logs = [workdir / "runs" / "nbint" / f"n{n}" / "node.log" for n in range(2)]

    def interrupt_once_every_rank_sleeps() -> None:
        wait_until(lambda: all(_count(p, "sleeping rank") == 2 for p in logs), 180, "ranks")
        assert client.km is not None and client.km.provisioner is not None
        os.kill(client.km.provisioner.pid, signal.SIGINT)  # what "interrupt kernel" sends

    with client.setup_kernel():
        thread = threading.Thread(target=interrupt_once_every_rank_sleeps, daemon=True)
        thread.start()
        started = time.monotonic()
        client.execute_cell(nb.cells[0], 0)
        took = time.monotonic() - started
    text = "".join(
        o.get("text", "") for o in nb.cells[0].outputs if o.get("output_type") == "stream"
    )
    assert "INTERRUPTED" in text, text
    assert took < 240, took
    run_no_leak("nbint")


def _count(path: Path, words: str) -> int:
    try:
        return path.read_text(errors="replace").count(words)
    except OSError:
        return 0
