"""What a started run's ``stacks()`` and ``top()`` return: the data ``sshddp stacks`` and
``sshddp top --once --json`` show, taken by the same code (``run.stacks``, ``run.top``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from sshddp.cli.options import check_node, make_ssh
from sshddp.errors import SshddpError
from sshddp.model import stacks as model_stacks
from sshddp.model.stacks import Group, HostStacks, Member
from sshddp.run import registry, runs
from sshddp.run import stacks as run_stacks
from sshddp.run import top as run_top
from sshddp.run.top import Snapshot


@dataclass(frozen=True)
class Stacks:
    """Every rank's stacks, as ``sshddp stacks`` groups and prints them."""

    run_id: str
    at: float  #: when the collection started (epoch seconds)
    nodes: tuple[HostStacks, ...]  #: each node's answer, or why there is none
    groups: list[Group]  #: processes whose stacks are the same; the odd ones out first
    missing: list[Member]  #: the processes that have no stack (each says why)
    saved: Optional[Path]  #: where the full dumps went (None: they could not be saved)

    def __str__(self) -> str:
        """As ``sshddp stacks`` prints them."""
        return model_stacks.render(self.groups, self.missing)


class Peek:
    """A run's live views, by its id: ``stacks()`` and ``top()``."""

    def __init__(self, run_id: str, kw: Mapping[str, Any]) -> None:
        self.id = run_id  #: the run's id, as ``sshddp ps`` knows it
        self._kw = dict(kw)  #: the launch command's options (ssh, fan-out)

    def stacks(self, node: Optional[int] = None, native: bool = False) -> Stacks:
        """Every rank's stacks now, without stopping it (of node ``node`` only, if given);
        the full dumps are saved under the run's log directory, as ``sshddp stacks`` does.
        A run that has ended raises ``RunNotRunning``."""
        record = runs.started(registry.resolve(self.id))
        check_node(record, node)
        ssh = make_ssh(self._kw, fallback_config=record.ssh_config)
        got = run_stacks.collect(record, ssh, self._kw["fanout"], node, native)
        run_stacks.check_live(got)
        try:
            saved: Optional[Path] = run_stacks.save(got, Path(record.log_dir))
        except SshddpError:  # the stacks come back all the same
            saved = None
        groups = model_stacks.group(got.nodes)
        missing = model_stacks.without_stacks(got.nodes)
        return Stacks(got.run_id, got.at, got.nodes, groups, missing, saved)

    def top(self, node: Optional[int] = None) -> Snapshot:
        """One snapshot of every node (its GPUs) and every rank (CPU, memory, steps per
        second, the slow ones flagged), as ``sshddp top --once --json``. A run that has
        ended raises ``RunNotRunning``."""
        record = runs.started(registry.resolve(self.id))
        check_node(record, node)
        ssh = make_ssh(self._kw, fallback_config=record.ssh_config)
        with run_top.open_pool(record, ssh, self._kw["fanout"], node) as pool:
            got = run_top.snapshot(record, ssh, self._kw["fanout"], node, pool)
        run_top.check_live(got)
        return got
