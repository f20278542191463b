"""Commands on existing runs, from any terminal: attach, logs, ps, stop."""

from __future__ import annotations

import time
from typing import Any

import click

from sshddp.cli.launch import report_result
from sshddp.cli.options import CONTEXT, Exit, make_ssh, ssh_options, terminal_of
from sshddp.errors import ExitCode
from sshddp.hosts.transport import SshOptions
from sshddp.run import coordinator, registry, runs
from sshddp.run.registry import RunRecord


def _ssh_for(record: RunRecord, kw: dict[str, Any]) -> SshOptions:
    """The options given, with the run's own ssh_config when none was given."""
    return make_ssh(kw, fallback_config=record.ssh_config)


@click.command(name="attach", context_settings=CONTEXT)
@click.argument("run")
@ssh_options
@click.pass_context
def attach(ctx: click.Context, run: str, **kw: Any) -> None:
    """Follow RUN live again, like launch; exit with its result."""
    terminal = terminal_of(ctx)
    record = registry.resolve(run)
    result = coordinator.attach(record, _ssh_for(record, kw), kw["fanout"], terminal)
    raise Exit(report_result(terminal, result))


@click.command(name="logs", context_settings=CONTEXT)
@click.argument("run")
@click.option("--node", type=click.IntRange(min=0), metavar="K", help="Only node K (raw).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the run ends.")
@click.option("--tail", type=click.IntRange(min=0), metavar="N", help="Last N lines per node.")
@ssh_options
@click.pass_context
def logs(ctx: click.Context, run: str, **kw: Any) -> None:
    """Print RUN's logs, fetching what the local copy lacks from the hosts first."""
    record = registry.resolve(run)
    node = kw["node"]
    if node is not None and node >= len(record.nodes):
        raise click.BadParameter(
            f"run {record.run_id} has nodes 0-{len(record.nodes) - 1}", param_hint="--node"
        )
    ssh = _ssh_for(record, kw)
    runs.show_logs(record, ssh, kw["fanout"], terminal_of(ctx), node, kw["tail"], kw["follow"])
    raise Exit(ExitCode.OK)


@click.command(name="ps", context_settings=CONTEXT)
@click.option("--all", "show_all", is_flag=True, help="Also finished runs.")
@ssh_options
@click.pass_context
def ps(ctx: click.Context, show_all: bool, **kw: Any) -> None:
    """List the runs this machine started, with each node's state read live."""
    from rich.table import Table

    terminal = terminal_of(ctx)
    rows = runs.ps_rows(show_all, lambda record: _ssh_for(record, kw), kw["fanout"])
    if not rows:
        terminal.out("no runs" + ("" if show_all else " in progress (`sshddp ps --all` lists all)"))
        raise Exit(ExitCode.OK)
    table = Table(header_style="bold")
    for col in ("run", "started", "duration", "nodes", "root cause"):
        table.add_column(col)
    for row in rows:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.started))
        summary = " ".join(f"{i}:{s.get('state')}" for i, s in enumerate(row.states))
        table.add_row(row.run_id, started, _duration(row.duration), summary, row.root_cause)
    terminal.show([table])
    raise Exit(ExitCode.OK)


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


@click.command(name="stop", context_settings=CONTEXT)
@click.argument("run")
@click.option("--force", is_flag=True, help="SIGKILL at once, no grace period.")
@ssh_options
@click.pass_context
def stop(ctx: click.Context, run: str, **kw: Any) -> None:
    """Stop RUN on every host (SIGTERM, grace, SIGKILL); a finished run is a no-op."""
    terminal = terminal_of(ctx)
    record = registry.resolve(run)
    code = ExitCode.OK
    for done in runs.stop(record, _ssh_for(record, kw), kw["fanout"], kw["force"]):
        name = f"node {done.node.node_rank} ({done.node.host.host})"
        if done.answer is None:
            terminal.err(f"{name}: NOT stopped: {done.error}")
            code = ExitCode.UNREACHABLE
            continue
        already = done.answer.get("already")
        note = done.answer.get("note")  # what stop left alone on the host, and why
        terminal.out(
            f"{name}: "
            + (f"was already {done.answer.get('state', '?')}" if already else "stopped")
            + (f"; {note}" if note else "")
        )
    raise Exit(code)
