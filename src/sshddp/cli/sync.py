"""``sshddp sync``: every host gets the environment of a uv project's lock."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path
from typing import Any

import click

from sshddp.cli.hostlist import host_list_options, split_hosts
from sshddp.cli.options import CONTEXT, Exit, make_ssh, ssh_options, terminal_of, trace_option
from sshddp.cli.terminal import Terminal
from sshddp.errors import UsageError
from sshddp.model import sync as model
from sshddp.model.sync import Progress
from sshddp.run.sync import Meter, load_project, sync_hosts, uv_version
from sshddp.run.syncwheels import fetch


@click.command("sync", context_settings=CONTEXT)
@click.argument("args", nargs=-1, metavar="INVENTORY PROJECT")
@click.option(
    "--offline",
    is_flag=True,
    help="For hosts with no index to reach: fetch the lock's wheels here, once, send them to "
    "one host, which hands them on to the others; every host installs with no index.",
)
@ssh_options
@trace_option
@host_list_options
@click.pass_context
def sync(ctx: click.Context, args: tuple[str, ...], **kw: Any) -> None:
    """Give every host of INVENTORY (or of -H) the virtual environment that PROJECT's lock
    describes: PROJECT is a uv project (a directory with pyproject.toml and uv.lock), a
    pylock.toml, or a requirements file (resolved once, here).

    Each host's environment lives under its sshddp workdir (envs/KEY), KEY a hash of the
    lock, the host's platform and its Python; a host that has it answers at once. uv does
    the installing (sshddp brings it to a host without it), with the inventory's env; a
    line per building host says how far it got. --offline: the wheels come from here, once.
    `launch --sync PROJECT` runs the ranks in it. Exit 0 when every host has its
    environment, 7 when one could not be built (uv's message names why), 4 when a host
    could not be reached.
    """
    terminal = terminal_of(ctx)
    ssh = make_ssh(kw)
    inventory, rest, _ = split_hosts(ctx, args, kw, "PROJECT")
    if len(rest) != 1:
        raise UsageError("expected one PROJECT: `sshddp sync INVENTORY PROJECT`")
    project = load_project(rest[0])
    with tempfile.TemporaryDirectory(prefix="sshddp-wheels-") as folder:
        wheels = None
        if kw["offline"]:
            project, wheels = fetch(project, uv_version(), Path(folder))
        board, meter = Board(terminal, [h.host for h in inventory.hosts]), Meter()
        try:
            results = sync_hosts(
                inventory, project, ssh, kw["fanout"], False, board.show, wheels, meter
            )
        finally:
            board.close()
    for note in meter.notes:
        terminal.err(note)
    for what, record in meter.uv:
        terminal.err(model.handed_line(what, record))
    for result in sorted(results, key=lambda r: r.node):
        terminal.out(model.line(result, project.python))
    terminal.err(model.summary(results))
    if wheels is not None:
        terminal.err(model.sent_line(meter.sent, wheels.size, len(wheels.listed)))
    raise Exit(model.exit_code(results))


class Board:
    """How far each building host got, on stderr: on a terminal a line per host redrawn in
    place (and erased before the report), elsewhere a plain line each time a host moves on.
    A host that is ready never moves on, so a warm sync draws nothing."""

    def __init__(self, terminal: Terminal, hosts: list[str]) -> None:
        self.terminal = terminal
        self.lines = [f"{host}: checking" for host in hosts]
        self.live = _isatty(terminal.stderr)
        self.drawn = False
        self._lock = threading.Lock()  # the pool's threads report at once

    def show(self, node: int, host: str, progress: Progress) -> None:
        text = model.progress_line(host, progress)
        with self._lock:
            if not self.live:
                self.terminal.err(text)
                return
            # a line the terminal wraps would throw the redraw off by one
            self.lines[node] = text[: self.terminal.size()[0] - 1]
            up = f"\x1b[{len(self.lines)}A" if self.drawn else ""
            self.terminal.stderr.write(up + "".join(f"\x1b[2K{line}\n" for line in self.lines))
            self.terminal.stderr.flush()
            self.drawn = True

    def close(self) -> None:
        with self._lock:
            if self.drawn:  # the report's lines take the board's place
                self.terminal.stderr.write(f"\x1b[{len(self.lines)}A\x1b[J")
                self.terminal.stderr.flush()
                self.drawn = False


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
