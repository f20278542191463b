"""``sshddp quarantine``: list the hosts kept out of launches, or clear them."""

from __future__ import annotations

import json
from typing import Any

import click

from sshddp.cli.options import CONTEXT, Exit, terminal_of
from sshddp.errors import ExitCode, UsageError
from sshddp.model import quarantine as model
from sshddp.model.escape import visible
from sshddp.run.quarantine import store


@click.command(name="quarantine", context_settings=CONTEXT)
@click.option(
    "--clear",
    "clear_hosts",
    multiple=True,
    metavar="HOST",
    help="Take HOST out of quarantine (repeatable), as the inventory names it.",
)
@click.option("--all", "clear_all", is_flag=True, help="Take every host out of quarantine.")
@click.option("--json", "as_json", is_flag=True, help="Print the quarantined hosts as JSON.")
@click.pass_context
def quarantine(ctx: click.Context, **kw: Any) -> None:
    """List the quarantined hosts: each was left out of launches when a run ended because
    of it (its node lost, its host unreachable at launch, the only node that never joined,
    a GPU hardware error, a health check failed at launch), until its cooldown ends (launch
    --quarantine-for, default 24h). `--clear HOST` or `--all` takes hosts out now."""
    terminal = terminal_of(ctx)
    hosts, every = list(kw["clear_hosts"]), kw["clear_all"]
    if hosts and every:
        raise UsageError("quarantine takes --clear HOST or --all, not both")
    if hosts or every:
        for entry in store.clear(None if every else hosts):
            terminal.err(f"sshddp: {entry.host} is out of quarantine (it was: {entry.reason})")
        raise Exit(ExitCode.OK)
    entries = store.active()
    if kw["as_json"]:
        terminal.out(json.dumps({"hosts": [_entry_json(e) for e in entries]}, indent=1))
    elif not entries:
        terminal.err(f"sshddp: no host is quarantined ({store.path()})")
    else:
        terminal.out(_table(entries))
    raise Exit(ExitCode.OK)


def _entry_json(entry: model.Entry) -> dict[str, Any]:
    return {
        "host": entry.host,
        "reason": entry.reason,
        "evidence": entry.evidence,
        "since": entry.since,
        "until": entry.until,
        "run_id": entry.run_id,
    }


def _table(entries: tuple[model.Entry, ...]) -> str:
    rows = [("HOST", "REASON", "SINCE", "UNTIL", "RUN", "EVIDENCE")]
    for e in entries:
        since, until = model.when(e.since), model.when(e.until)
        rows.append((e.host, e.reason, since, until, e.run_id, visible(e.evidence)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1] for r in rows
    )
