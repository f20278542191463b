"""The launch's watchdog options: how long the world may take to form, and how long the
run may stay silent (``remote/node/host_watchdog.py`` runs them on the hosts)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, TypeVar

import click

from sshddp import defaults
from sshddp.cli.options import Seconds
from sshddp.cli.terminal import Terminal
from sshddp.errors import SshddpError
from sshddp.hosts.transport import SshOptions
from sshddp.model.hang import culprits, render
from sshddp.model.state import RunResult
from sshddp.run import registry
from sshddp.run.hang import collect

F = TypeVar("F", bound=Callable[..., Any])


def watchdog_options(fn: F) -> F:
    """--init-timeout, --stall-timeout and --on-stall."""
    fn = click.option(
        "--on-stall",
        type=click.Choice(["stop", "report"]),
        default=defaults.ON_STALL,
        show_default=True,
        help="On a stall: collect every rank's stacks, then stop the run (state stalled, "
        "exit code 6), or only report them and let it go on.",
    )(fn)
    fn = click.option(
        "--stall-timeout",
        type=Seconds(min=0),
        default=0.0,
        show_default=True,
        metavar="SECONDS",
        help="A run none of whose ranks wrote output or was seen working (stacks or CPU time "
        "moving) for this long, counted from when every rank got through "
        "init_process_group, has stalled; 0: off.",
    )(fn)
    return click.option(
        "--init-timeout",
        type=Seconds(min=0),
        default=defaults.INIT_TIMEOUT,
        show_default=True,
        metavar="SECONDS",
        help="Once a rank calls init_process_group, every rank must be through it this long "
        "after the run started, or the run is stopped (exit code 6); 0: off.",
    )(fn)


def hang_report(terminal: Terminal, result: RunResult, ssh: SshOptions, fanout: int) -> RunResult:
    """After a run a watchdog stopped: print the stacks it took, read back from the hosts;
    the result with its root cause as they say it (the odd ones out, their node)."""
    result, text = read_hang(result, ssh, fanout)
    if text:
        terminal.err(text)
    return result


def read_hang(result: RunResult, ssh: SshOptions, fanout: int) -> tuple[RunResult, str]:
    """The result with its root cause as the stacks the watchdog took say it, and those
    stacks as text (or why they could not be read)."""
    try:
        hangs = collect(registry.resolve(result.run_id), ssh, fanout)
    except SshddpError as exc:
        return result, f"sshddp: the stacks the watchdog took could not be read: {exc.message}"
    text = render(result.run_id, hangs).rstrip("\n")
    node, cause = culprits(hangs)
    if not cause:
        return result, text
    return replace(result, hang_cause=cause, root_cause=node), text
