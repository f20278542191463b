"""What the commands share: click settings, the connection options, and how a command ends.

Only the CLI imports click.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Optional, TypeVar

import click

from sshddp import defaults, trace
from sshddp.cli.terminal import Terminal
from sshddp.errors import UsageError
from sshddp.hosts.transport import SshOptions
from sshddp.model.envvars import hide_url_credentials
from sshddp.model.quarantine import parse_duration
from sshddp.model.ranksel import parse_ranks
from sshddp.run.registry import RunRecord

F = TypeVar("F", bound=Callable[..., Any])
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class Exit(Exception):
    """Raised by commands to end with a given status after printing their report."""

    def __init__(self, code: int) -> None:
        self.code = code


class Seconds(click.FloatRange):
    """A number of seconds from ``min`` to ``defaults.MAX_SECONDS``: never nan or inf, which
    pass a range check (every comparison with nan is false) and then break what uses them."""

    name = "seconds"

    def __init__(self, min: float = 0.0) -> None:
        super().__init__(min=min, max=defaults.MAX_SECONDS)

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Any) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds.", param, ctx)
        return super().convert(number, param, ctx)


class Duration(click.ParamType):
    """A duration: ``24h``, ``30m``, ``90s``, ``2d``, ``1h30m``, a bare number of seconds."""

    name = "duration"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Any) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def count(min: int, max: int) -> click.IntRange:
    """A whole number from ``min`` to ``max`` (click refuses nan, inf and 1e3 as integers)."""
    return click.IntRange(min=min, max=max)


def ssh_options(fn: F) -> F:
    """The connection options every command that reaches hosts takes."""
    decorators = [
        click.option(
            "--ssh-config",
            metavar="FILE",
            envvar="SSHDDP_SSH_CONFIG",
            type=click.Path(dir_okay=False),
            help="ssh_config to use instead of ~/.ssh/config (like ssh -F).",
        ),
        click.option(
            "--accept-new-host-keys",
            is_flag=True,
            help="Trust and record unknown host keys (changed keys are always refused).",
        ),
        click.option(
            "--connect-timeout",
            type=Seconds(min=0.1),
            metavar="SECONDS",
            default=defaults.CONNECT_TIMEOUT,
            show_default=True,
            help="Seconds to connect, get the SSH banner and authenticate.",
        ),
        click.option(
            "--fanout",
            type=count(1, defaults.MAX_FANOUT),
            default=defaults.FANOUT,
            show_default=True,
            help="Hosts contacted at once.",
        ),
    ]
    for deco in reversed(decorators):
        fn = deco(fn)
    return fn


class PortOrAuto(click.ParamType):
    """A rendezvous port number, or ``auto`` (``defaults.AUTO_PORT``); the command checks
    the range (a run also uses port + 1)."""

    name = "N|auto"

    def convert(self, value: Any, param: Optional[click.Parameter], ctx: Any) -> int:
        if value == "auto" or value == defaults.AUTO_PORT:
            return defaults.AUTO_PORT
        try:
            port = int(value)
        except (TypeError, ValueError):
            port = 0
        if port < 1:  # -1 would pass for AUTO_PORT
            self.fail(f"{value!r}: expected a port number (1-65534) or auto", param, ctx)
        return port


PORT_OR_AUTO = PortOrAuto()
PORT_HELP = "Rendezvous port, or auto: node 0 picks a free pair P, P+1 (from 29502 up)."


def log_dir_option(fn: F) -> F:
    """``--log-dir``: where the run's local log copies go (``DIR/RUN``, made ours alone)."""
    return click.option(
        "--log-dir",
        default=defaults.LOG_DIR,
        show_default=True,
        metavar="DIR",
        help="Local copies of the nodes' logs go in DIR/RUN (made owner-only).",
    )(fn)


def ranks_option(fn: F) -> F:
    """``--ranks``: the ranks whose output the console shows; the log files keep all."""
    return click.option(
        "--ranks",
        "show_ranks",
        metavar="LIST",
        help="Show only these global ranks' output on the console, e.g. 0 or 0,3-5; the log "
        "files keep every rank's. torchrun's own lines show with any rank of their node; so "
        "does a node whose lines' ranks are not known (--tty, --launcher node).",
    )(fn)


def verbose_option(fn: F) -> F:
    """``-v``: torchrun's own lines on the console too (the log files keep them either way),
    and sshddp's trace on stderr."""
    return click.option(
        "-v",
        "--verbose",
        is_flag=True,
        callback=_trace_on,
        help="Show torchrun's own lines too (its banner, its stopping of workers, its "
        "failure summary; the log files keep them either way), and trace what sshddp does "
        "(connections, phases, decisions, timings) on stderr.",
    )(fn)


def trace_option(fn: F) -> F:
    """``-v``: sshddp's trace on stderr, for the commands that reach hosts."""
    return click.option(
        "-v",
        "--verbose",
        is_flag=True,
        expose_value=False,
        callback=_trace_on,
        help="Trace what sshddp does (connections, phases, decisions, timings) on stderr; "
        f"{trace.ENV}=FILE writes the trace to FILE instead.",
    )(fn)


def _trace_on(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        trace.to_stderr(terminal_of(ctx).stderr, ctx.info_name or "", hide_url_credentials)
    return value


def selected_ranks(text: Optional[str], option: str = "--ranks") -> Optional[frozenset[int]]:
    """The ranks ``--ranks`` names (bad input: a UsageError naming the part); None: all."""
    return None if text is None else parse_ranks(text, option)


def select_verbose(terminal: Terminal, verbose: bool) -> None:
    """``-v`` onto the terminal: the console shows torchrun's own lines too."""
    terminal.verbose = verbose


def transport_option(fn: F) -> F:
    """``--transport``: how every host is reached, over the inventory's ``transport:``."""
    return click.option(
        "--transport",
        type=click.Choice(["ssh", "srun"]),
        help="Reach every host over SSH, or as steps of its Slurm job (srun; needs INVENTORY "
        "slurm, slurm:JOBID or hosts: {slurm: ...}). Default: the inventory's, else ssh.",
    )(fn)


def make_ssh(kw: dict[str, Any], fallback_config: Optional[str] = None) -> SshOptions:
    """The connection options given in ``kw``; ``fallback_config`` is the ssh_config to use
    when none was given (a recorded run's)."""
    path = kw["ssh_config"] or fallback_config
    if path and not os.path.isfile(path):
        raise UsageError(f"--ssh-config {path}: no such file")
    return SshOptions(
        ssh_config=path,
        accept_new_host_keys=kw["accept_new_host_keys"],
        connect_timeout=kw["connect_timeout"],
    )


def terminal_of(ctx: click.Context) -> Terminal:
    terminal = ctx.obj
    assert isinstance(terminal, Terminal)
    return terminal


def check_node(record: RunRecord, node: Optional[int]) -> None:
    """Refuse a ``--node`` the run does not have (``None``: every node)."""
    if node is not None and node >= len(record.nodes):
        raise click.BadParameter(
            f"run {record.run_id} has nodes 0-{len(record.nodes) - 1}", param_hint="--node"
        )
