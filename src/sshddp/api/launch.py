"""``sshddp.launch(fn, inventory)``: the launch command's machinery, called with a function.

The function, its arguments and cloudpickle are written to a directory that the launch
ships as its ``--workdir`` (``--fresh-cwd``: a directory of the run's own on every node);
the command's parser checks the options; ``cli.launch.launch_on`` runs it as it runs any
script. Once the run ended, the ranks' records are fetched back (``run.fetch``) and become
the values, in global-rank order, or the error that says why there are none.
"""

from __future__ import annotations

import codecs
import os
import signal
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Generic, Optional, TypeVar, Union, cast

import click

from sshddp.api import call
from sshddp.api.errors import RankFailed, RunFailed, RunHung
from sshddp.api.options import env_argv, inventory_argv, option_names, options_argv
from sshddp.cli import launch as command
from sshddp.cli.options import make_ssh
from sshddp.cli.terminal import Terminal
from sshddp.errors import Interrupted, UsageError
from sshddp.model.inventory import Inventory
from sshddp.model.layout import RunLayout
from sshddp.model.state import RunResult
from sshddp.protocol.contract import RUN_ID_VAR
from sshddp.run import registry
from sshddp.run.fetch import NoProgress, fetch

T = TypeVar("T")


@dataclass(frozen=True)
class LaunchResult(Generic[T]):
    """A run whose every rank returned."""

    values: list[T]  #: each rank's return value, in global-rank order
    run_id: str  #: the run's id, as ``sshddp ps`` / ``logs`` know it
    report: RunResult  #: the report the CLI prints, as data
    report_text: str  #: that report, as the CLI prints it
    hosts: tuple[str, ...] = field(default=())  #: each rank's host, in global-rank order

    def by_host(self) -> dict[str, list[T]]:
        """The values by host, each host's in rank order."""
        out: dict[str, list[T]] = {}
        for host, value in zip(self.hosts, self.values):
            out.setdefault(host, []).append(value)
        return out


def launch(
    fn: Callable[..., T],
    inventory: Union[str, os.PathLike[str], Inventory],
    *,
    args: Sequence[Any] = (),
    kwargs: Optional[Mapping[str, Any]] = None,
    env: Optional[Mapping[str, str]] = None,
    init: bool = False,
    **options: Any,
) -> LaunchResult[T]:
    """Run ``fn(*args, **kwargs)`` on every rank of ``inventory`` (a file, ``"slurm"``, a
    host list such as ``"gpu-a:8,gpu-b:8"``, or an ``Inventory``) under torchrun, and return
    every rank's value. ``init=True`` joins the process group first (NCCL on GPUs, else
    gloo). ``options`` are the launch command's, named without dashes (``max_restarts=2``)."""
    refuse_inside_rank()
    hooks = {"end_with_caller": True}  # a dead caller leaves no run behind
    outcome, kw, tmp = _launched(fn, inventory, args, kwargs, env, init, options, [], hooks)
    with tmp:
        return returned(outcome, kw, Path(tmp.name) / "results")


def refuse_inside_rank() -> None:
    if RUN_ID_VAR in os.environ:
        raise UsageError(
            f"launch() inside a rank of run {os.environ[RUN_ID_VAR]}: a run cannot start "
            "another from its ranks; call it from the script or notebook that drives them"
        )


def _launched(
    fn: Callable[..., Any],
    inventory: Union[str, os.PathLike[str], Inventory],
    args: Sequence[Any],
    kwargs: Optional[Mapping[str, Any]],
    env: Optional[Mapping[str, str]],
    init: bool,
    options: Mapping[str, Any],
    extra: Sequence[str],
    hooks: Mapping[str, Any],
) -> tuple[command.LaunchOutcome, dict[str, Any], tempfile.TemporaryDirectory[str]]:
    """The launch of the call, to its end (or, with ``--detach`` in ``extra``, until every
    node started); its outcome, the command's options, and the call's directory (the
    caller removes it). ``hooks``: what the API adds to the command's options
    (``end_with_caller``, ``on_started``), which no command line sets."""
    params = _command_options()
    argv = [*options_argv(options, *params), *env_argv(env), *extra]
    tmp = tempfile.TemporaryDirectory(prefix="sshddp-call-")
    try:
        root = call.bundle(Path(tmp.name), fn, args, kwargs or {}, init)
        argv += ["--workdir", str(root), "--fresh-cwd"]
        outcome, kw = _run(inventory, argv, _terminal(), hooks)
    except BaseException:
        tmp.cleanup()
        raise
    return outcome, kw, tmp


def _command_options() -> tuple[dict[str, str], frozenset[str]]:
    """The launch command's options by API name, and those that are flags."""
    known: dict[str, str] = {}
    flags: set[str] = set()
    for param in command.launch.params:
        if isinstance(param, click.Option):
            names = option_names(param.opts)
            known.update(names)
            if param.is_flag:
                flags.update(names)
    return known, frozenset(flags)


def _run(
    inventory: Union[str, os.PathLike[str], Inventory],
    argv: list[str],
    terminal: Terminal,
    hooks: Mapping[str, Any],
) -> tuple[command.LaunchOutcome, dict[str, Any]]:
    """The launch, as ``sshddp launch ARGV INVENTORY rankcall.py`` runs it."""
    words = [] if isinstance(inventory, Inventory) else _inventory_words(inventory)
    with _click_errors(), _sigint_restored():
        ctx = command.launch.make_context(
            "launch", [*argv, *words, call.SCRIPT], obj=terminal, resilient_parsing=False
        )
        with ctx:
            kw = {**ctx.params, **hooks}
            args = tuple(kw.pop("args"))
            if "on_parsed" in hooks:  # start(): its Run stops the run with these options
                hooks["on_parsed"](kw)
            try:
                if isinstance(inventory, Inventory):
                    return command.launch_on(inventory, args, kw, terminal), kw
                return command.run_launch(ctx, args, kw, terminal), kw
            except Interrupted:
                raise KeyboardInterrupt from None  # nothing had started anywhere


def _inventory_words(inventory: Union[str, os.PathLike[str]]) -> Sequence[str]:
    text = os.fspath(inventory)
    return inventory_argv(text, os.path.exists(text))


@contextmanager
def _click_errors() -> Iterator[None]:
    """The command's parser's complaints, as UsageError with its message."""
    try:
        yield
    except click.ClickException as exc:
        raise UsageError(f"launch(): {exc.format_message()}") from None


@contextmanager
def _sigint_restored() -> Iterator[None]:
    """The launch takes SIGINT over; the caller's handler is put back after."""
    try:
        previous = signal.getsignal(signal.SIGINT)
    except ValueError:
        previous = None
    try:
        yield
    finally:
        if previous is not None:
            try:
                signal.signal(signal.SIGINT, previous)
            except (ValueError, TypeError):  # not the main thread
                pass


def returned(
    outcome: command.LaunchOutcome, kw: Mapping[str, Any], dest: Path
) -> LaunchResult[Any]:
    """The values, or the error that says why there are none."""
    result = outcome.result
    if result is None:
        raise RunFailed("launch(): the run ended without a result", "", outcome.report)
    if result.detached:
        raise RunFailed(
            f"run {result.run_id} detached (Ctrl-\\ or a hangup): it goes on without this "
            f"call; `sshddp attach {result.run_id}` follows it",
            result.run_id,
            outcome.report,
        )
    if result.interrupted:
        raise KeyboardInterrupt
    if result.hung:
        raise RunHung(outcome.report, result.run_id, outcome.report, outcome.stacks or None)
    layout = registry.resolve(result.run_id).layout()
    records = call.read_records(_fetched(result.run_id, kw, dest))
    if not result.ok:
        raise _failure(outcome, result, layout, records)
    got = call.values(records, result.run_id)
    hosts = tuple(_host_of(layout, r)[0] for r in range(layout.world_size))
    ordered = call.in_rank_order(got, layout.world_size, result.run_id)
    return LaunchResult(ordered, result.run_id, result, outcome.report, hosts)


def _fetched(run_id: str, kw: Mapping[str, Any], dest: Path) -> list[Path]:
    """Every node's records, copied here (a node that left none has none)."""
    record = registry.resolve(run_id)
    fetch(record, make_ssh(dict(kw)), kw["fanout"], call.RESULT_DIR, dest, None, NoProgress())
    return sorted(dest.rglob("rank*.pkl"))


def _failure(
    outcome: command.LaunchOutcome,
    result: RunResult,
    layout: RunLayout,
    records: Mapping[int, Mapping[str, Any]],
) -> RunFailed:
    raised = call.first_raised(records)
    if raised is None:
        return RunFailed(outcome.report, result.run_id, outcome.report)
    host, node = _host_of(layout, raised.rank)
    finished = _finished(records, result.run_id)
    message = (
        f"rank {raised.rank} (node {node}, host {host}) raised {raised.type}: "
        f"{raised.message}\n{raised.traceback.rstrip()}"
    )
    return RankFailed(
        message,
        run_id=result.run_id,
        report=outcome.report,
        rank=raised.rank,
        host=host,
        node=node,
        traceback=raised.traceback,
        root_cause=_root_line(outcome.report),
        values=finished,
    )


def _finished(records: Mapping[int, Mapping[str, Any]], run_id: str) -> dict[int, Any]:
    ok = {r: rec for r, rec in records.items() if rec.get("ok")}
    try:
        return call.values(ok, run_id)
    except Exception:  # a value that cannot come back does not hide the failure
        return {}


def _host_of(layout: RunLayout, rank: int) -> tuple[str, int]:
    for node in layout.nodes:
        if rank in node.ranks:
            return node.host.host, node.node_rank
    return "?", -1


def _root_line(report: str) -> str:
    """The report's root-cause line (the first naming it), else its first line."""
    lines = report.splitlines()
    return next(
        (ln.strip() for ln in lines if "root cause" in ln.lower()), lines[0] if lines else ""
    )


class _TextBytes:
    """The ranks' output (bytes) onto a text stream that has no ``buffer`` (a notebook's)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def write(self, data: bytes) -> int:
        self.stream.write(self.decoder.decode(data))
        return len(data)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False


def _terminal() -> Terminal:
    """This process's streams; the ranks' output goes to sys.stdout (a notebook's cell)."""
    raw = getattr(sys.stdout, "buffer", None)
    out = cast(BinaryIO, raw if raw is not None else _TextBytes(sys.stdout))
    return Terminal(
        stdout=sys.stdout, stderr=sys.stderr, stdout_bytes=out, environ=dict(os.environ)
    )
