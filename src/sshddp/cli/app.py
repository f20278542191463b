"""The command line: one group of commands, and the one place that maps errors to exits.

``main`` is the console script; ``run`` runs the CLI in-process and returns the status
(tests use it). Only here is ``sys.exit`` called and a final error message printed;
everything below raises ``SshddpError`` (httpie's ``main``/``program`` split).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Optional

import click

from sshddp import __version__, trace
from sshddp.cli.doctor import doctor
from sshddp.cli.exec import exec_
from sshddp.cli.fetch import fetch
from sshddp.cli.launch import launch
from sshddp.cli.options import CONTEXT, Exit
from sshddp.cli.quarantine import quarantine
from sshddp.cli.runs import attach, logs, ps, stop
from sshddp.cli.smoke import smoke
from sshddp.cli.stacks import stacks
from sshddp.cli.sync import sync
from sshddp.cli.terminal import Terminal
from sshddp.cli.top import top
from sshddp.errors import ExitCode, SshddpError
from sshddp.model.envvars import hide_url_credentials
from sshddp.model.escape import visible

#: Every command, by name.
COMMANDS: dict[str, click.Command] = {
    "attach": attach,
    "doctor": doctor,
    "exec": exec_,
    "fetch": fetch,
    "launch": launch,
    "logs": logs,
    "ps": ps,
    "quarantine": quarantine,
    "smoke": smoke,
    "stacks": stacks,
    "stop": stop,
    "sync": sync,
    "top": top,
}


@click.group(context_settings=CONTEXT, commands=COMMANDS)
@click.version_option(__version__, "-V", "--version", prog_name="sshddp")
@click.option(
    "--traceback",
    is_flag=True,
    envvar="SSHDDP_TRACEBACK",
    help="Show Python tracebacks of errors (for bug reports).",
)
@click.pass_context
def cli(ctx: click.Context, traceback: bool) -> None:
    """Run PyTorch distributed training across machines over plain SSH."""
    ctx.meta["traceback"] = traceback


def main(argv: Optional[Sequence[str]] = None, terminal: Optional[Terminal] = None) -> None:
    """Console-script entry point: exits with the documented status. A command that took
    over SIGINT (a launch or attach, once a node may run) keeps it until the process ends:
    a late Ctrl-C never turns a run handed off or ended into exit 130. Nor does one while
    the interpreter shuts down (it would otherwise die of the signal)."""
    code = _run(argv, terminal)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


def run(argv: Optional[Sequence[str]] = None, terminal: Optional[Terminal] = None) -> int:
    """Run the CLI in-process; returns the exit status (used by tests). The caller's SIGINT
    handler is put back afterwards."""
    previous = signal.getsignal(signal.SIGINT)
    try:
        return _run(argv, terminal)
    finally:
        with contextlib.suppress(ValueError, TypeError):  # not the main thread; not Python's
            signal.signal(signal.SIGINT, previous)


def _run(argv: Optional[Sequence[str]], terminal: Optional[Terminal]) -> int:
    terminal = terminal or Terminal.from_process()
    started = time.monotonic()
    try:
        code = _run_cli(list(sys.argv[1:] if argv is None else argv), terminal)
        trace.log.info("exit %d after %.3f s", code, trace.since(started))
        return code
    finally:
        trace.close()


def _run_cli(args: list[str], terminal: Terminal) -> int:
    show_tb = "--traceback" in args or terminal.environ.get("SSHDDP_TRACEBACK") == "1"
    try:
        trace.from_env(terminal.environ, terminal.stderr, _cmd(args).strip(), hide_url_credentials)
        # click prints --help and --version to sys.stdout; they belong to the terminal too.
        with contextlib.redirect_stdout(terminal.stdout):
            cli.main(args=args, prog_name="sshddp", standalone_mode=False, obj=terminal)
        return ExitCode.OK
    except Exit as done:
        return done.code
    except click.exceptions.Exit as done:
        return int(done.exit_code)
    except click.ClickException as exc:
        terminal.err(f"sshddp: error: {exc.format_message()}\n(see `sshddp {_cmd(args)}--help`)")
        return ExitCode.BAD_INPUT
    except click.exceptions.Abort:
        terminal.err("sshddp: interrupted")
        return ExitCode.INTERRUPTED
    except SshddpError as exc:
        return _failed(terminal, exc, show_tb)
    except KeyboardInterrupt:
        terminal.err("sshddp: interrupted")
        return ExitCode.INTERRUPTED
    except Exception as exc:  # the last line of defence: a bug, reported without a traceback
        if show_tb:
            traceback.print_exc(file=terminal.stderr)
        terminal.err(
            f"sshddp: internal error: {type(exc).__name__}: {exc}\n"
            "This is a bug in sshddp; rerun with --traceback and report it."
        )
        return ExitCode.INTERNAL


def _failed(terminal: Terminal, exc: SshddpError, show_tb: bool) -> int:
    if show_tb:
        traceback.print_exc(file=terminal.stderr)
    # A message may quote what a host said: its control characters are shown, not obeyed.
    terminal.err(f"sshddp: error: {visible(exc.message, multiline=True)}")
    hint = getattr(exc, "hint", "")
    if hint:
        terminal.err(f"  fix: {visible(hint, multiline=True)}")
    return int(exc.exit_code)


def _cmd(args: list[str]) -> str:
    return next((a + " " for a in args if a in COMMANDS), "")
