"""``sshddp stacks``: where every rank of a running run stands, from any terminal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import click

from sshddp.cli.complete import complete_run_ids
from sshddp.cli.options import (
    CONTEXT,
    Exit,
    check_node,
    make_ssh,
    ssh_options,
    terminal_of,
    trace_option,
)
from sshddp.cli.terminal import Terminal
from sshddp.errors import ExitCode, SshddpError
from sshddp.hosts.transport import SshOptions
from sshddp.model import hang as model_hang
from sshddp.model import stacks as model
from sshddp.run import hang as run_hang
from sshddp.run import registry
from sshddp.run import stacks as run_stacks
from sshddp.run.stacks import Collected


@click.command(name="stacks", context_settings=CONTEXT)
@click.argument("run", shell_complete=complete_run_ids)
@click.option("--node", type=click.IntRange(min=0), metavar="K", help="Only node K.")
@click.option(
    "--native",
    is_flag=True,
    help="Read C/C++ frames too, with `py-spy dump --native` where py-spy is installed.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document (see docs/hangs.md)."
)
@ssh_options
@trace_option
@click.pass_context
def stacks(ctx: click.Context, run: str, **kw: Any) -> None:
    """Print the stack of every thread of every rank of RUN, grouped, without stopping it.

    Ranks whose stacks are the same share one block; the smallest groups come first, as the
    odd ones out. The full dumps are saved under the run's log directory.
    """
    terminal = terminal_of(ctx)
    record = registry.resolve(run)
    node = kw["node"]
    check_node(record, node)
    ssh = make_ssh(kw, fallback_config=record.ssh_config)
    got = run_stacks.collect(record, ssh, kw["fanout"], node, kw["native"])
    if not got.live and not got.unreachable and show_hang(terminal, record, ssh, kw["fanout"]):
        raise Exit(ExitCode.OK)  # it ended hung: the stacks its watchdog took
    run_stacks.check_live(got)
    unsaved: Optional[SshddpError] = None
    try:
        saved: Optional[Path] = run_stacks.save(got, Path(record.log_dir))
    except SshddpError as exc:  # the stacks are printed all the same, then the error
        saved, unsaved = None, exc
    groups = model.group(got.nodes)
    if kw["as_json"]:
        where = str(saved) if saved else None
        doc = model.json_doc(
            got.run_id, got.nodes, groups, collected=got.at, elapsed=got.elapsed, saved=where
        )
        terminal.out(json.dumps(doc, indent=1))
    else:
        terminal.out(model.render(groups, model.without_stacks(got.nodes)))
    _notes(terminal, got, groups, saved)
    if unsaved is not None:
        raise unsaved
    raise Exit(ExitCode.UNREACHABLE if got.unreachable else ExitCode.OK)


def show_hang(terminal: Terminal, record: registry.RunRecord, ssh: SshOptions, fanout: int) -> bool:
    """Print the stacks a watchdog took when the run hung (on stdout); False when no node
    recorded any."""
    text = model_hang.render(record.run_id, run_hang.collect(record, ssh, fanout))
    if text:
        terminal.out(text.rstrip("\n"))
    return bool(text)


def _notes(
    terminal: Terminal, got: Collected, groups: list[model.Group], saved: Optional[Path]
) -> None:
    """What the user should know besides the stacks, on stderr."""
    terminal.err(
        f"sshddp: run {got.run_id}: {model.summary(got.nodes, groups)}, "
        f"collected in {got.elapsed:.2f} s"
    )
    for h in got.nodes:
        if h.record is None:
            terminal.err(f"sshddp: node {h.node_rank} ({h.host}): NO stacks: {h.error}")
        elif h.record["note"]:
            terminal.err(f"sshddp: node {h.node_rank} ({h.host}): {h.record['note']}")
        elif not h.record["processes"]:
            terminal.err(
                f"sshddp: node {h.node_rank} ({h.host}) is {h.record['state']}: no process left"
            )
    if saved is not None:
        terminal.err(f"sshddp: full dumps (one file per process): {saved}/")
