"""``sshddp top``: every node's GPUs and every rank's CPU, memory and step rate, the slow
one named; live, or one snapshot (``--once``, ``--json``)."""

from __future__ import annotations

import json
import time
from typing import Any, Optional

import click

from sshddp.cli.complete import complete_run_ids
from sshddp.cli.options import (
    CONTEXT,
    Exit,
    check_node,
    make_ssh,
    selected_ranks,
    ssh_options,
    terminal_of,
    trace_option,
)
from sshddp.cli.terminal import Terminal
from sshddp.errors import ExitCode
from sshddp.model import top as model
from sshddp.run import registry
from sshddp.run import top as run_top
from sshddp.run.top import Snapshot

_HOME_CLEAR = "\x1b[H\x1b[J"  # cursor home, then clear below: the table redraws in place


@click.command(name="top", context_settings=CONTEXT)
@click.argument("run", shell_complete=complete_run_ids)
@click.option("--node", type=click.IntRange(min=0), metavar="K", help="Only node K.")
@click.option("--ranks", "show_ranks", metavar="LIST", help="Only these global ranks, e.g. 0,3-5.")
@click.option("--once", is_flag=True, help="Print one snapshot and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print one snapshot as JSON and exit.")
@ssh_options
@trace_option
@click.pass_context
def top(ctx: click.Context, run: str, **kw: Any) -> None:
    """Show every node and every rank of RUN as it runs: CPU, memory, GPUs, steps per
    second from each rank's progress bar; a rank well below the others' median is SLOW;
    the rank the others wait for in collectives (its stacks say it works while theirs
    wait) is the STRAGGLER."""
    terminal = terminal_of(ctx)
    record = registry.resolve(run)
    node = kw["node"]
    check_node(record, node)
    ranks = selected_ranks(kw["show_ranks"])
    ssh = make_ssh(kw, fallback_config=record.ssh_config)
    with run_top.open_pool(record, ssh, kw["fanout"], node) as pool:
        got = run_top.snapshot(record, ssh, kw["fanout"], node, pool)
        run_top.check_live(got)
        if kw["as_json"] or kw["once"]:
            _show(terminal, got, ranks, kw["as_json"])
            raise Exit(ExitCode.OK)
        with run_top.LiveTop(record, pool, node) as live:
            while True:  # Ctrl-C ends it (exit 130, as for attach)
                terminal.out(_HOME_CLEAR + _table(got, ranks))
                time.sleep(run_top.REFRESH)
                got = live.snapshot()
                if not any(n.state in ("starting", "running") for n in got.nodes):
                    _show(terminal, got, ranks, False)
                    raise Exit(ExitCode.OK)


def _narrow(got: Snapshot, ranks: Optional[frozenset[int]]) -> list[model.RankRow]:
    return [r for r in got.ranks if ranks is None or r.rank in ranks]


def _table(got: Snapshot, ranks: Optional[frozenset[int]]) -> str:
    when = time.strftime("%H:%M:%S", time.localtime(got.at))
    head = f"sshddp top {got.run_id}  {when}  {model.summary(got.ranks)}"
    return head + "\n" + model.render(got.nodes, _narrow(got, ranks))


def _show(
    terminal: Terminal, got: Snapshot, ranks: Optional[frozenset[int]], as_json: bool
) -> None:
    if as_json:
        doc = model.json_doc(got.run_id, got.at, got.nodes, _narrow(got, ranks))
        doc["summary"] = model.summary(got.ranks)  # slowness is judged against every rank
        doc["stragglers"] = [s.__dict__ for s in model.stragglers(got.ranks)]
        terminal.out(json.dumps(doc, indent=1))
        return
    terminal.out(_table(got, ranks))
    terminal.err(f"sshddp: run {got.run_id}: {model.summary(got.ranks)}")
