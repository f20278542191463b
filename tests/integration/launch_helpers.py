"""Running the real sshddp CLI as a subprocess against the sshd test cluster."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from sshddp_lab.sshd import SshdCluster

JOB = Path(__file__).parent / "payloads" / "job.py"
SSHDDP = [sys.executable, "-m", "sshddp"]
#: seconds a wait that spans a run's start (every rank importing torch) may take: a guard
#: against "never", not a target. CI's 4 workers on 2 cores took 68 s for a 3-node start
#: and failure (test_runs.py), past the 60 s this used to be.
RUN_BOUND = 180.0


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str
    run_id: str
    cwd: Path
    workdir: Path

    def local_log(self, node: int) -> Path:
        return self.cwd / "sshddp-logs" / self.run_id / f"node{node}-h{node + 1}.log"

    def remote_log(self, node: int) -> Path:
        return self.workdir / "runs" / self.run_id / f"n{node}" / "node.log"

    def json_lines(self, node: int) -> list[dict[str, Any]]:
        out = []
        for line in self.local_log(node).read_text(encoding="utf-8").splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out


TRACEBACK = "Traceback (most recent call last):"
FOLDED = re.compile(r"\(after (rank \d+|node \d+)'s traceback; this one whole in (\S+)\)$")


def assert_one_failure_one_traceback(run: Run, nodes: int, first: str) -> list[str]:
    """A cascade's console (issue 45.4): the logs hold the failing rank's traceback and at
    least two of its victims' (the cascade happened), the console at most two whole; every
    other one is a line of its own naming ``first`` and the log that holds it whole, and
    that log does. Returns the folded lines."""
    paths = [run.local_log(n) for n in range(nodes)]
    logs = {path.name: path.read_text("utf-8", "replace") for path in paths}
    logged = sum(text.count(TRACEBACK) for text in logs.values())
    assert logged >= 3, logs
    assert run.stdout.count(TRACEBACK) <= 2, run.stdout
    folded = [m for m in map(FOLDED.search, run.stdout.splitlines()) if m]
    assert folded, run.stdout
    for m in folded:
        assert m.group(1) == first and TRACEBACK in logs[m.group(2)], (m.group(0), run.stdout)
    return [m.string for m in folded]


def write_inventory(
    cluster: SshdCluster,
    tmp: Path,
    port: int,
    hosts: list[int] | None = None,
    nproc: int = 2,
    env: dict[str, str] | None = None,
) -> tuple[Path, Path]:
    workdir = tmp / "remote"
    text = cluster.inventory_yaml(
        hosts or [1, 2, 3],
        nproc=nproc,
        rdzv_port=port,
        workdir=str(workdir),
        env={"GLOO_SOCKET_IFNAME": "lo", **(env or {})},
    )
    inv = tmp / "inv.yaml"
    inv.write_text(text)
    return inv, workdir


def cli_env(cluster: SshdCluster) -> dict[str, str]:
    return {**os.environ, "SSHDDP_SSH_CONFIG": str(cluster.ssh_config)}


def sshddp(
    cluster: SshdCluster, cwd: Path, *args: str | Path, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``sshddp ARGS`` as a subprocess in ``cwd``, reaching the test cluster's hosts."""
    return subprocess.run(
        [*SSHDDP, *map(str, args)],
        cwd=cwd,
        env=cli_env(cluster),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def launch(
    cluster: SshdCluster,
    tmp: Path,
    port: int,
    job_args: list[str],
    *,
    opts: list[str] = (),  # type: ignore[assignment]
    hosts: list[int] | None = None,
    nproc: int = 2,
    env: dict[str, str] | None = None,
    timeout: float = 180,
) -> Run:
    args = [str(JOB), *job_args]
    return launch_on(cluster, tmp, port, args, opts, hosts, nproc, env, timeout)


def launch_on(
    cluster: SshdCluster,
    tmp: Path,
    port: int,
    args: Sequence[str],
    opts: Sequence[str] = (),
    hosts: list[int] | None = None,
    nproc: int = 2,
    env: dict[str, str] | None = None,
    timeout: float = 420,
) -> Run:
    """``sshddp launch OPTS INV ARGS`` (a script and its arguments, or ``-- COMMAND``) on
    ``hosts`` of ``cluster``, ``nproc`` processes each, in ``tmp``."""
    inv, workdir = write_inventory(cluster, tmp, port, hosts, nproc, env)
    proc = subprocess.run(
        [*SSHDDP, "launch", *opts, str(inv), *args],
        cwd=tmp,
        env=cli_env(cluster),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    # A launch whose preflight failed names no run: it started none.
    run_id = run_id_of(proc.stderr) if "sshddp: run " in proc.stderr else ""
    return Run(proc.returncode, proc.stdout, proc.stderr, run_id, tmp, workdir)


def run_id_of(stderr: str) -> str:
    m = re.search(r"sshddp: run (\S+):", stderr)
    assert m, f"no run id in:\n{stderr}"
    return m.group(1)


def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``pred`` until it holds; the seconds that took, or fail naming ``what``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if pred():
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def has_node_mark(pid: int, mark: str) -> bool:
    """Whether process ``pid`` carries the run marker of node ``mark`` ("RUN/nK"; the
    marker goes on with the launch's nonce, "RUN/nK/<nonce>")."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    prefix = f"SSHDDP_NODE_MARK={mark}/".encode()
    return any(entry.startswith(prefix) for entry in env)


def start(cluster: SshdCluster, cwd: Path, *args: str) -> subprocess.Popen[str]:
    """``sshddp ARGS`` started in ``cwd`` against ``cluster``, its stderr piped."""
    return subprocess.Popen(
        [*SSHDDP, *args],
        cwd=cwd,
        env=cli_env(cluster),
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    """Its exit code and stderr; killed, and the test failed, past ``timeout``."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"sshddp did not exit within {timeout:.0f} s:\n{err}") from None
    return proc.returncode, err


def node_dir(workdir: Path, run: str, node: int) -> Path:
    return workdir / "runs" / run / f"n{node}"


def exit_record(workdir: Path, run: str, node: int) -> dict[str, Any] | None:
    try:
        return dict(json.loads((node_dir(workdir, run, node) / "exit.json").read_text()))
    except (OSError, ValueError):
        return None
