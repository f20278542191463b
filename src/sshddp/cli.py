"""The command line: parse, call one command, print its final report, map errors to exits.

This is the only module that calls ``sys.exit``; everything else raises ``SshddpError``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any, Callable, Optional, TypeVar

import click

from sshddp import __version__
from sshddp.environment import Environment
from sshddp.errors import ExitCode, SshddpError, UsageError
from sshddp.transport import DEFAULT_CONNECT_TIMEOUT, SshOptions

F = TypeVar("F", bound=Callable[..., Any])
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class Exit(Exception):
    """Raised by commands to end with a given status after printing their report."""

    def __init__(self, code: int) -> None:
        self.code = code


def ssh_options(fn: F) -> F:
    """The connection options every command that reaches hosts takes."""
    decorators = [
        click.option("--ssh-config", metavar="FILE", envvar="SSHDDP_SSH_CONFIG",
                     type=click.Path(dir_okay=False),
                     help="ssh_config to use instead of ~/.ssh/config (like ssh -F)."),
        click.option("--accept-new-host-keys", is_flag=True,
                     help="Trust and record unknown host keys (changed keys are always refused)."),
        click.option("--connect-timeout", type=click.FloatRange(min=0.1), metavar="SECONDS",
                     default=DEFAULT_CONNECT_TIMEOUT, show_default=True,
                     help="Seconds to connect, get the SSH banner and authenticate."),
        click.option("--fanout", type=click.IntRange(min=1), default=32, show_default=True,
                     help="Hosts contacted at once."),
    ]  # fmt: skip
    for deco in reversed(decorators):
        fn = deco(fn)
    return fn


def make_ssh(kw: dict[str, Any]) -> SshOptions:
    path = kw.pop("ssh_config")
    if path and not os.path.isfile(path):
        raise UsageError(f"--ssh-config {path}: no such file")
    return SshOptions(
        ssh_config=path,
        accept_new_host_keys=kw.pop("accept_new_host_keys"),
        connect_timeout=kw.pop("connect_timeout"),
    )


def env_of(ctx: click.Context) -> Environment:
    env = ctx.obj
    assert isinstance(env, Environment)
    return env


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="sshddp")
@click.option("--traceback", is_flag=True, envvar="SSHDDP_TRACEBACK",
              help="Show Python tracebacks of errors (for bug reports).")  # fmt: skip
@click.pass_context
def cli(ctx: click.Context, traceback: bool) -> None:
    """Run PyTorch distributed training across machines over plain SSH."""
    ctx.meta["traceback"] = traceback


@cli.command(context_settings=CONTEXT)
@click.argument("inventory", type=click.Path())
@ssh_options
@click.option("--script", metavar="FILE", help="Also check that FILE is present or shippable.")
@click.option("--port", type=click.IntRange(1, 65535), help="Rendezvous port to check.")
@click.option("--json", "as_json", is_flag=True, help="Print facts and findings as JSON.")
@click.pass_context
def doctor(ctx: click.Context, inventory: str, **kw: Any) -> None:
    """Check every host of INVENTORY: reachability, Python/torch/CUDA/NCCL parity, GPUs,
    the rendezvous port and its reachability from every host. Exit 0 when all pass, 3 when
    a check fails."""
    from sshddp.commands import run_doctor

    ssh = make_ssh(kw)
    code = run_doctor(env_of(ctx), inventory, ssh, kw["script"], kw["port"], kw["as_json"],
                      kw["fanout"])  # fmt: skip
    raise Exit(code)


# Not interspersed: parsing stops at INVENTORY, so the script's own options pass through.
@cli.command(context_settings={**CONTEXT, "allow_interspersed_args": False})
@click.argument("inventory", type=click.Path())
@click.argument("script_and_args", nargs=-1, type=click.UNPROCESSED)
@ssh_options
@click.option("-m", "--module", metavar="MODULE", help="Run a Python module instead of SCRIPT.")
@click.option(
    "--nproc-per-node", type=int, metavar="N", help="Processes per node (default: gpus, or nproc)."
)
@click.option("--port", type=int, metavar="N", help="Rendezvous port.")
@click.option(
    "--env",
    "env_items",
    multiple=True,
    metavar="KEY=VALUE",
    help="Environment for every rank (repeatable); KEY alone copies it from here.",
)
@click.option("--workdir", metavar="DIR", help="Ship this local directory (honours .gitignore).")
@click.option("--log-dir", default="sshddp-logs", show_default=True, metavar="DIR")
@click.option("--name", metavar="NAME", help="Run id (refused if it exists).")
@click.option("--dry-run", is_flag=True, help="Print the per-node plan; connect to nothing.")
@click.option("--no-check", is_flag=True, help="Skip the preflight checks.")
@click.option("--detach", is_flag=True, help="Return once every node has started.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=0, show_default=True)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="SIGTERM to SIGKILL at teardown.",
)
@click.option(
    "--heartbeat-timeout",
    type=click.FloatRange(min=0.5),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="A node silent this long counts as lost, and the run is stopped.",
)
@click.option(
    "--tty",
    is_flag=True,
    help="Give the ranks a terminal (isatty() true: colours, progress bars) instead of a "
    "pipe; caps a node's output near 100 MB/s.",
)
@click.pass_context
def launch(ctx: click.Context, inventory: str, script_and_args: tuple[str, ...], **kw: Any) -> None:
    """Start SCRIPT (or -m MODULE) under torchrun on every host of INVENTORY.

    Options go before INVENTORY; everything after SCRIPT goes to the script verbatim.
    """
    from sshddp.commands import run_launch

    ssh = make_ssh(kw)
    raise Exit(run_launch(env_of(ctx), inventory, script_and_args, ssh, kw))


def _register_run_commands() -> None:
    from sshddp.runs_cli import register

    register(cli)


def main(argv: Optional[Sequence[str]] = None, env: Optional[Environment] = None) -> None:
    """Console-script entry point: exits with the documented status."""
    sys.exit(run(argv, env))


def run(argv: Optional[Sequence[str]] = None, env: Optional[Environment] = None) -> int:
    """Run the CLI in-process; returns the exit status (used by tests)."""
    env = env or Environment.from_process()
    args = list(sys.argv[1:] if argv is None else argv)
    show_tb = "--traceback" in args or env.environ.get("SSHDDP_TRACEBACK") == "1"
    try:
        # click prints --help and --version to sys.stdout; they belong to env's stdout too.
        with contextlib.redirect_stdout(env.stdout):
            cli.main(args=args, prog_name="sshddp", standalone_mode=False, obj=env)
        return ExitCode.OK
    except Exit as done:
        return done.code
    except click.exceptions.Exit as done:
        return int(done.exit_code)
    except click.ClickException as exc:
        env.err(f"sshddp: error: {exc.format_message()}\n(see `sshddp {_cmd(args)}--help`)")
        return ExitCode.BAD_INPUT
    except click.exceptions.Abort:
        env.err("sshddp: interrupted")
        return ExitCode.INTERRUPTED
    except SshddpError as exc:
        if show_tb:
            traceback.print_exc(file=env.stderr)
        env.err(f"sshddp: error: {exc.message}")
        hint = getattr(exc, "hint", "")
        if hint:
            env.err(f"  fix: {hint}")
        return int(exc.exit_code)
    except KeyboardInterrupt:
        env.err("sshddp: interrupted")
        return ExitCode.INTERRUPTED
    except Exception as exc:  # the last line of defence: a bug, reported without a traceback
        if show_tb:
            traceback.print_exc(file=env.stderr)
        env.err(
            f"sshddp: internal error: {type(exc).__name__}: {exc}\n"
            "This is a bug in sshddp; rerun with --traceback and report it."
        )
        return ExitCode.INTERNAL


def _cmd(args: list[str]) -> str:
    names = {"doctor", "launch", "attach", "logs", "ps", "stop"}
    return next((a + " " for a in args if a in names), "")


_register_run_commands()
