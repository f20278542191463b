"""``sshddp smoke``: a short distributed job through the normal launch path, then its findings.

The job (``sshddp/jobs/smoke.py``) ships like any script: preflight, staging, torchrun on
every node, teardown and logs are a launch's. Its ranks' lines go to the logs only; node 0's
log then holds the record ``model.smoke`` reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Optional

from sshddp.hosts.transport import SshOptions
from sshddp.model.inventory import Inventory
from sshddp.model.plan import LaunchOptions
from sshddp.model.smoke import SmokeReport, find_record
from sshddp.model.state import RunResult
from sshddp.run import coordinator
from sshddp.run.sinks import Screen, tail_lines

JOB = Path(__file__).resolve().parent.parent / "jobs" / "smoke.py"
RECORD_LINES = 2000  # node 0's log is short: the record is among its last lines


class _Discard:
    """The ranks' live lines: smoke prints its table instead (the logs keep every byte)."""

    def write(self, data: bytes) -> int:
        return len(data)

    def flush(self) -> None:
        pass


@dataclass
class _QuietScreen:
    screen: Screen
    stdout_bytes: BinaryIO
    color: bool = False
    verbose: bool = False

    def out(self, text: str) -> None:
        self.screen.err(text)

    def err(self, text: str) -> None:
        self.screen.err(text)


def job_args(sizes: tuple[int, ...], iters: int, p2p_bytes: int) -> tuple[str, ...]:
    args = ["--iters", str(iters), "--p2p-bytes", str(p2p_bytes)]
    if sizes:
        args += ["--sizes", ",".join(str(s) for s in sizes)]
    return tuple(args)


def smoke(
    inventory: Inventory,
    options: LaunchOptions,
    ssh: SshOptions,
    mode: coordinator.LaunchMode,
    screen: Screen,
    secrets: frozenset[str] = frozenset(),
) -> tuple[Optional[RunResult], Optional[SmokeReport]]:
    """Run the smoke job; (the run's result, the findings when node 0 printed them)."""
    quiet = _QuietScreen(screen, _Discard())  # type: ignore[arg-type]
    result = coordinator.launch(inventory, options, ssh, mode, quiet, secrets)
    if result is None or not result.nodes or result.nodes[0].log_path is None:
        return result, None
    record = find_record(tail_lines(result.nodes[0].log_path, RECORD_LINES))
    if record is None:
        return result, None
    hosts = tuple(h.host for h in inventory.hosts)
    procs = tuple(options.nproc_per_node or h.procs for h in inventory.hosts)
    return result, SmokeReport(record, hosts, procs)
