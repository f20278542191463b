"""``sshddp.start(fn, inventory)``: a launch that returns once every node started, as a
``Run`` to wait for, stop, or look into later (``stacks``, ``top``); ``attach``, ``ps``,
``logs``, ``stacks`` and ``top`` know it by its id as any run.

Unless ``detach=True`` the run stays bound to this process: a thread of it follows the run
(its launch sessions stay open, its output streams to this process's stdout), so the run
ends when this process does, as ``launch``'s. With ``detach=True`` it is ``--detach``: the
run goes on without this process, and ``wait`` attaches to it.
"""

from __future__ import annotations

import os
import tempfile
import threading
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
from sshddp.api.peek import Peek
from sshddp.cli.launch import LaunchOutcome, report_text
from sshddp.cli.options import make_ssh
from sshddp.cli.watchdog import read_hang
from sshddp.model.inventory import Inventory
from sshddp.model.plan import new_run_id
from sshddp.run import coordinator, registry, runs
from sshddp.run.registry import RunRecord

T = TypeVar("T")
Launched = tuple[LaunchOutcome, dict[str, Any], "tempfile.TemporaryDirectory[str]"]
WAIT_STEP = 0.2  # seconds between looks at the following thread: Ctrl-C is seen between


class Follow(threading.Thread):
    """The launch of a ``start`` without ``detach``, followed to its end in this thread."""

    def __init__(self, launch: Callable[[Mapping[str, Any]], Launched]) -> None:
        super().__init__(name="sshddp-run", daemon=True)  # dies with this process: so does the run
        self._launch = launch
        self.ready = threading.Event()  #: set once every node started, or the launch ended
        self.booted = False  #: every node started
        self.kw: dict[str, Any] = {}  #: the launch command's options, once parsed
        self.launched: Optional[Launched] = None
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        hooks = {"end_with_caller": True, "on_started": self._on_started, "on_parsed": self._parsed}
        try:
            self.launched = self._launch(hooks)
        except BaseException as exc:  # handed to the caller's thread (start or wait)
            self.error = exc
        finally:
            self.ready.set()

    def _parsed(self, kw: dict[str, Any]) -> None:
        self.kw = kw

    def _on_started(self) -> None:
        self.booted = True
        self.ready.set()

    def joined(self) -> Launched:
        """Its end (the error it raised, raised here)."""
        while self.is_alive():
            self.join(WAIT_STEP)
        if self.error is not None:
            raise self.error
        assert self.launched is not None
        return self.launched


class Run(Peek, Generic[T]):
    """A run that ``start`` left going: ``.wait()`` follows it to its end (Ctrl-C stops it)."""

    def __init__(self, run_id: str, kw: Mapping[str, Any], follow: Optional[Follow] = None):
        super().__init__(run_id, kw)
        self._follow = follow  #: the thread following it (None: detached)
        self._result: Optional[LaunchResult[T]] = None

    def __repr__(self) -> str:
        return f"Run({self.id!r})"

    def wait(self) -> LaunchResult[T]:
        """Follow the run to its end; every rank's value, as ``launch`` returns them."""
        if self._result is None:
            self._result = self._joined() if self._follow is not None else self._attached()
        return self._result

    def _joined(self) -> LaunchResult[T]:
        assert self._follow is not None
        try:
            outcome, kw, tmp = self._follow.joined()
        except KeyboardInterrupt:  # stopped on every host before it re-raises
            self.stop()
            self._follow.join()
            raise
        with tmp:
            return returned(outcome, kw, Path(tmp.name) / "results")

    def _attached(self) -> LaunchResult[T]:
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

    def _record(self) -> RunRecord:
        return runs.started(registry.resolve(self.id))


def start(
    fn: Callable[..., T],
    inventory: Union[str, os.PathLike[str], Inventory],
    *,
    args: Sequence[Any] = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    env: Optional[Mapping[str, str]] = None,
    init: bool = False,
    detach: bool = False,
    **options: Any,
) -> Run[T]:
    """As ``launch``, but return once every node started: the run goes on without the call.
    It ends when this process does, unless ``detach=True`` (then it outlives this process:
    ``sshddp attach`` or ``Run.wait`` follow it later)."""
    refuse_inside_rank()
    name = str(options.pop("name", None) or new_run_id())

    def launched(extra: Sequence[str], hooks: Mapping[str, Any]) -> Launched:
        words = [*extra, "--name", name]
        return _launched(fn, inventory, args, kwargs, env, init, options, words, hooks)

    if detach:
        return _detached(name, launched(["--detach"], {}))
    follow = Follow(lambda hooks: launched([], hooks))
    follow.start()
    return _bound(name, follow)


def _detached(name: str, launched: Launched) -> Run[Any]:
    outcome, kw, tmp = launched
    with tmp:  # staged on every node already
        if outcome.result is not None:  # it ended before every node started: why
            returned(outcome, kw, Path(tmp.name) / "results")
            raise RunFailed(outcome.report, outcome.result.run_id, outcome.report)
    return Run(name, kw)


def _bound(name: str, follow: Follow) -> Run[Any]:
    """The run once every node started (Ctrl-C meanwhile: stopped once they have)."""
    try:
        while not follow.ready.wait(WAIT_STEP):
            pass
    except KeyboardInterrupt:
        follow.ready.wait()
        if follow.booted:
            Run(name, follow.kw, follow).stop()
        follow.join()
        raise
    if not follow.booted:  # it ended before every node started: why
        outcome, kw, tmp = follow.joined()
        with tmp:
            returned(outcome, kw, Path(tmp.name) / "results")
            raise RunFailed(outcome.report, name, outcome.report)
    return Run(name, follow.kw, follow)
