"""Commands on existing runs, from any terminal: attach, logs, ps, stop."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Optional

import click

from sshddp.cli.complete import complete_run_ids
from sshddp.cli.launch import report_result
from sshddp.cli.options import (
    CONTEXT,
    Exit,
    check_node,
    make_ssh,
    ranks_option,
    select_verbose,
    selected_ranks,
    ssh_options,
    terminal_of,
    trace_option,
    verbose_option,
)
from sshddp.cli.watchdog import hang_report
from sshddp.errors import ExitCode, UsageError
from sshddp.hosts.transport import SshOptions
from sshddp.model.escape import visible
from sshddp.run import coordinator, registry, runs
from sshddp.run import ps as run_ps
from sshddp.run.registry import RunRecord

if TYPE_CHECKING:  # rich is imported when a table is printed
    from rich.table import Table


def _ssh_for(record: RunRecord, kw: dict[str, Any]) -> SshOptions:
    """The options given, with the run's own ssh_config when none was given."""
    return make_ssh(kw, fallback_config=record.ssh_config)


@click.command(name="attach", context_settings=CONTEXT)
@click.argument("run", shell_complete=complete_run_ids)
@ssh_options
@ranks_option
@verbose_option
@click.pass_context
def attach(ctx: click.Context, run: str, **kw: Any) -> None:
    """Follow RUN live again, like launch; exit with its result."""
    terminal = terminal_of(ctx)
    ranks = selected_ranks(kw["show_ranks"])
    select_verbose(terminal, kw["verbose"])
    record = runs.started(registry.resolve(run))
    ssh = _ssh_for(record, kw)
    result = coordinator.attach(record, ssh, kw["fanout"], terminal, ranks)
    if result.hung:
        result = hang_report(terminal, result, ssh, kw["fanout"])
    raise Exit(report_result(terminal, result))


@click.command(name="logs", context_settings=CONTEXT)
@click.argument("run", shell_complete=complete_run_ids)
@click.option("--node", type=click.IntRange(min=0), metavar="K", help="Only node K (raw).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the run ends.")
@click.option("--tail", type=click.IntRange(min=0), metavar="N", help="Last N lines per node.")
@click.option("--rank", metavar="N", help="Only rank N's output (as --ranks N).")
@ssh_options
@trace_option
@ranks_option
@click.pass_context
def logs(ctx: click.Context, run: str, **kw: Any) -> None:
    """Print RUN's logs, fetching what the local copy lacks from the hosts first."""
    given = [o for o in ("node", "rank", "show_ranks") if kw[o] is not None]
    if len(given) > 1:
        raise UsageError("logs takes one of --node K, --rank N and --ranks LIST, not several")
    ranks = selected_ranks(kw["rank"], "--rank") or selected_ranks(kw["show_ranks"])
    record = runs.started(registry.resolve(run))
    node = kw["node"]
    check_node(record, node)
    ssh = _ssh_for(record, kw)
    terminal = terminal_of(ctx)
    runs.show_logs(record, ssh, kw["fanout"], terminal, node, kw["tail"], kw["follow"], ranks)
    raise Exit(ExitCode.OK)


@click.command(name="ps", context_settings=CONTEXT)
@click.argument("run", required=False, shell_complete=complete_run_ids)
@click.option("--all", "show_all", is_flag=True, help="Also finished runs.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the runs as JSON (fields: docs/runs.md)."
)
@ssh_options
@trace_option
@click.pass_context
def ps(ctx: click.Context, run: Optional[str], show_all: bool, as_json: bool, **kw: Any) -> None:
    """List the runs this machine started (or only RUN, finished or not), with each node's
    state read live (finished runs as recorded). A host that does not answer in time is
    named, its nodes unreachable."""
    terminal = terminal_of(ctx)
    only = registry.resolve(run).run_id if run is not None else None
    report = run_ps.ps(
        show_all, lambda record: _ssh_for(record, kw), kw["fanout"], kw["connect_timeout"], only
    )
    for note in report.notes:
        terminal.err(f"sshddp: {visible(note)}")
    if as_json:
        rows = [row.to_json() for row in report.rows]
        terminal.out(json.dumps({"runs": rows, "notes": report.notes}, indent=1))
        raise Exit(ExitCode.OK)
    if not report.rows:
        terminal.out("no runs" + ("" if show_all else " in progress (`sshddp ps --all` lists all)"))
        raise Exit(ExitCode.OK)
    terminal.show([_ps_table(report.rows)])
    raise Exit(ExitCode.OK)


def _ps_table(rows: list[run_ps.PsRow]) -> Table:
    """The rows as a table; whatever came from the hosts escaped (no markup, no controls)."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(header_style="bold")
    for col in ("run", "started", "duration", "nodes", "root cause"):
        table.add_column(col)
    for row in rows:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.started))
        summary = " ".join(row.node_text(i) for i in range(len(row.states)))
        table.add_row(
            row.run_id,
            started,
            _duration(row.duration),
            summary,
            escape(visible(row.root_cause)),
        )
    return table


def _duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


@click.command(name="stop", context_settings=CONTEXT)
@click.argument("run", shell_complete=complete_run_ids)
@click.option("--force", is_flag=True, help="SIGKILL at once, no grace period.")
@ssh_options
@trace_option
@click.pass_context
def stop(ctx: click.Context, run: str, **kw: Any) -> None:
    """Stop RUN on every host (SIGTERM, grace, SIGKILL); a finished run is a no-op."""
    terminal = terminal_of(ctx)
    record = runs.started(registry.resolve(run))
    code = ExitCode.OK
    stops = runs.stop(record, _ssh_for(record, kw), kw["fanout"], kw["force"])
    for done in stops:
        name = f"node {done.node.node_rank} ({done.node.host.host})"
        if done.answer is None:
            terminal.err(f"{name}: NOT stopped: {visible(done.error, multiline=True)}")
            code = ExitCode.UNREACHABLE
            continue
        note = done.answer.get("note")  # what stop left alone on the host, and why
        terminal.out(f"{name}: {done.outcome()}" + (f"; {visible(note)}" if note else ""))
    for line in runs.record_if_ended(record, [d.answer for d in stops]):
        terminal.err(visible(line))
    raise Exit(code)
