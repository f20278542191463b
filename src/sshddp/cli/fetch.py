"""``sshddp fetch``: copy back what a run wrote on its nodes, with a progress bar on a
terminal for large transfers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from sshddp.errors import ExitCode
from sshddp.model.escape import visible
from sshddp.run import fetch as fetching
from sshddp.run import registry

if TYPE_CHECKING:
    from rich.progress import Progress as RichBar
    from rich.progress import TaskID

LARGE = 8 << 20  #: transfers from this size up get a progress bar on a terminal


class Bars:
    """``run.fetch.FetchProgress`` as rich progress bars, one per large transfer."""

    def __init__(self, bar: RichBar) -> None:
        self.bar = bar
        self.tasks: dict[int, TaskID] = {}

    def begin(self, key: int, label: str, total: int) -> None:
        if total >= LARGE:
            self.tasks[key] = self.bar.add_task(label, total=total)

    def advance(self, key: int, size: int) -> None:
        task = self.tasks.get(key)
        if task is not None:
            self.bar.advance(task, size)


@contextmanager
def progress_for(terminal: Terminal) -> Iterator[fetching.FetchProgress]:
    """Bars on stderr when it is a terminal; nothing when it is piped or redirected."""
    stream = terminal.stderr
    if not getattr(stream, "isatty", lambda: False)() or terminal.environ.get("TERM") == "dumb":
        yield fetching.NoProgress()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    console = Console(file=stream, no_color="NO_COLOR" in terminal.environ)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console) as bar:
        yield Bars(bar)


@click.command(name="fetch", context_settings=CONTEXT)
@click.argument("run", shell_complete=complete_run_ids)
@click.argument("path")
@click.argument("dest", required=False, default=".")
@click.option("--node", type=click.IntRange(min=0), metavar="K", help="Only node K.")
@ssh_options
@trace_option
@click.pass_context
def fetch(ctx: click.Context, run: str, path: str, dest: str, **kw: Any) -> None:
    """Copy PATH, a file or directory RUN wrote on each node, into DEST/node<K>-<host>/.

    A relative PATH is taken from the run's working directory on each host. Every copy is
    checked against the size and SHA-256 the host sent before it takes its place. Nodes
    without PATH are named, and are no failure when another node had it (and no --node).
    DEST must be a directory that no one else can write in, or a sticky one of yours.
    """
    terminal = terminal_of(ctx)
    record = registry.resolve(run)
    node = kw["node"]
    check_node(record, node)
    ssh = make_ssh(kw, fallback_config=record.ssh_config)
    with progress_for(terminal) as progress:
        copies = fetching.fetch(record, ssh, kw["fanout"], path, Path(dest), node, progress)
    for line in fetching.summary(copies, node):
        terminal.out(line)
    code = ExitCode.OK
    absent = fetching.absent(copies, node)
    for copy in copies:
        if copy.error is None or copy in absent:
            continue
        hint = getattr(copy.error, "hint", "")
        name = f"node {copy.node.node_rank} ({copy.node.host.host})"
        terminal.err(f"sshddp: {name}: NOT fetched: {visible(copy.error.message)}")
        if hint:
            terminal.err(f"  fix: {visible(hint)}")
        code = code or copy.error.exit_code
    raise Exit(code)
