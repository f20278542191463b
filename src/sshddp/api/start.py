"""``sshddp.start(fn, inventory)``: a launch that returns once every node started (``--detach``),
as a ``Run`` to wait for, stop, or read the logs of later; ``attach``, ``ps``, ``logs``,
``stacks`` and ``top`` know it by its id as any run."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Generic, Optional, TypeVar, Union

from sshddp.api.errors import RunFailed
from sshddp.api.launch import (
    LaunchResult,
    _launched,
    _sigint_restored,
    _terminal,
    refuse_inside_rank,
    returned,
)
from sshddp.cli.launch import LaunchOutcome, report_text
from sshddp.cli.options import make_ssh
from sshddp.cli.watchdog import read_hang
from sshddp.model.inventory import Inventory
from sshddp.model.plan import new_run_id
from sshddp.run import coordinator, registry, runs
from sshddp.run.registry import RunRecord

T = TypeVar("T")


class Run(Generic[T]):
    """A run that ``start`` left going: ``.wait()`` follows it to its end (Ctrl-C stops it)."""

    def __init__(self, run_id: str, kw: Mapping[str, Any]) -> None:
        self.id = run_id  #: the run's id, as ``sshddp ps`` knows it
        self._kw = dict(kw)

    def __repr__(self) -> str:
        return f"Run({self.id!r})"

    def _record(self) -> RunRecord:
        return runs.started(registry.resolve(self.id))

    def wait(self) -> LaunchResult[T]:
        """Follow the run to its end; every rank's value, as ``launch`` returns them."""
        record = self._record()
        ssh = make_ssh(self._kw, fallback_config=record.ssh_config)
        with _sigint_restored():
            result = coordinator.attach(record, ssh, self._kw["fanout"], _terminal())
        stacks = ""
        if result.hung:
            result, stacks = read_hang(result, ssh, self._kw["fanout"])
        outcome = LaunchOutcome(result, report_text(result), int(result.exit_code), stacks)
        with tempfile.TemporaryDirectory(prefix="sshddp-wait-") as tmp:
            return returned(outcome, self._kw, Path(tmp) / "results")

    def stop(self, force: bool = False) -> None:
        """Stop every node (SIGTERM, the grace period, SIGKILL; at once with ``force``)."""
        record = self._record()
        ssh = make_ssh(self._kw, fallback_config=record.ssh_config)
        runs.stop(record, ssh, self._kw["fanout"], force)

    def logs(self) -> Path:
        """The run's local log directory (filled while a ``wait`` or ``attach`` follows it)."""
        return Path(self._record().log_dir)


def start(
    fn: Callable[..., T],
    inventory: Union[str, os.PathLike[str], Inventory],
    *,
    args: Sequence[Any] = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    env: Optional[Mapping[str, str]] = None,
    init: bool = False,
    **options: Any,
) -> Run[T]:
    """As ``launch``, but return once every node started: the run goes on without the call."""
    refuse_inside_rank()
    name = str(options.pop("name", None) or new_run_id())
    extra = ["--detach", "--name", name]
    outcome, kw, tmp = _launched(fn, inventory, args, kwargs, env, init, options, extra)
    with tmp:  # staged on every node already
        if outcome.result is not None:  # it ended before every node started: why
            returned(outcome, kw, Path(tmp.name) / "results")
            raise RunFailed(outcome.report, outcome.result.run_id, outcome.report)
    return Run(name, kw)
