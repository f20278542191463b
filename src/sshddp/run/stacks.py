"""``sshddp stacks``: every rank's stacks from every host of a run, at once, without
stopping it; then the full dumps saved under the run's local log directory.

Each host runs ``remote/calls/host_stacks.py`` over its connection, in parallel through the host
pool; what it does on the host (which process is which rank, the dump signal, py-spy) is told
there. Grouping and rendering are pure (``model.stacks``).
"""

from __future__ import annotations

import errno
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from sshddp import defaults
from sshddp.errors import HostUnreachable, LogWriteFailed, RunNotRunning, UsageError
from sshddp.hosts import calls
from sshddp.hosts.pool import HostPool
from sshddp.hosts.transport import SshOptions
from sshddp.model import stacks
from sshddp.model.layout import NodeLayout
from sshddp.model.stacks import HostStacks
from sshddp.protocol import contract
from sshddp.protocol.contract import NodeStacks
from sshddp.run.registry import RunRecord

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EIO)


@dataclass(frozen=True)
class Collected:
    """Every asked node's answer, and when it was collected."""

    run_id: str
    nodes: tuple[HostStacks, ...]
    at: float  #: when the collection started (epoch seconds)
    elapsed: float  #: seconds it took, every host in parallel

    @property
    def unreachable(self) -> list[HostStacks]:
        return [h for h in self.nodes if h.record is None]

    @property
    def live(self) -> list[HostStacks]:
        """The nodes that are starting or running, or still have processes."""
        return [
            h
            for h in self.nodes
            if h.record is not None
            and (
                h.record["processes"] or h.record["state"] in (contract.STARTING, contract.RUNNING)
            )
        ]


def collect(
    record: RunRecord, ssh: SshOptions, fanout: int, node: Optional[int], native: bool
) -> Collected:
    """Ask every node of the run (or node ``node`` only) for its stacks, in parallel."""
    at = time.time()
    nodes = [n for n in record.layout().nodes if node is None or n.node_rank == node]
    with HostPool([n.host for n in nodes], ssh, fanout) as pool:
        errors = pool.connect_all()

        def ask(n: NodeLayout) -> NodeStacks:
            return calls.node_stacks(pool.transport(n), n.rundir, native, defaults.STACKS_TIMEOUT)

        outcomes = pool.map(ask, [n for n in nodes if errors[n.index] is None])
    answers = []
    for n in nodes:
        err, outcome = errors[n.index], outcomes.get(n.index)
        if err is not None:
            why = err.message
        elif outcome is None or outcome.value is None:
            why = str(outcome.error if outcome else "no answer")
        else:
            answers.append(HostStacks(n.node_rank, n.host.host, outcome.value))
            continue
        answers.append(HostStacks(n.node_rank, n.host.host, error=why))
    return Collected(record.run_id, tuple(answers), at, time.time() - at)


def check_live(got: Collected) -> None:
    """Raise when there is nothing to show: every node has ended (RunNotRunning), or none
    that may still run could be reached (HostUnreachable)."""
    if got.live:
        return
    if got.unreachable:
        first = got.unreachable[0]
        raise HostUnreachable(
            first.host,
            "no stacks: "
            + "; ".join(f"node {h.node_rank} ({h.host}): {h.error}" for h in got.unreachable),
        )
    ends = ", ".join(
        f"node {h.node_rank} ({h.host}) {h.record['state'] if h.record else '?'}" for h in got.nodes
    )
    raise RunNotRunning(
        f"run {got.run_id} is not running ({ends}): it has no stacks to collect; "
        f"`sshddp logs {got.run_id}` shows its output"
    )


def save(got: Collected, log_dir: Path) -> Path:
    """Write every process's full dump, one file each, and the whole collection as
    stacks.json, into a new directory LOG_DIR/stacks/<time>/; its path."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(got.at))
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(got.at))
    try:
        target = _new_dir(log_dir / "stacks", stamp)
        for node in got.nodes:
            for process in node.record["processes"] if node.record else ():
                text = stacks.dump_text(node, process, when)
                (target / stacks.dump_name(node, process)).write_text(text, encoding="utf-8")
        doc = stacks.json_doc(got.run_id, got.nodes, stacks.group(got.nodes), collected=got.at)
        (target / "stacks.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    except OSError as exc:
        where = exc.filename or log_dir
        if exc.errno in _DISK_FULL:
            raise LogWriteFailed(f"cannot save the stacks under {where}: {exc.strerror}") from exc
        raise UsageError(
            f"cannot save the stacks under {where}: {exc.strerror}; the run's log directory "
            "must be writable"
        ) from exc
    return target


def _new_dir(parent: Path, stamp: str) -> Path:
    parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    for n in range(1, 1000):
        path = parent / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            path.mkdir(mode=0o700)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "too many collections in one second", str(parent))
