"""Where a command's hosts come from: an inventory file, or ``-H HOST:N,...`` on the line.

A command that takes ``-H`` has no INVENTORY argument then: its first word is already the
script (or the command). A ``--`` that comes before any other word is taken by click, so the
command's parser records where it was (``DashDashCommand``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional, TypeVar

import click

from sshddp.errors import UsageError
from sshddp.model.inventory import HOST_LIST_FORM, Inventory, with_spare_list
from sshddp.run.inputs import load_host_list, load_source

F = TypeVar("F", bound=Callable[..., Any])
_DASHDASH = "sshddp.dashdash"


class DashDashCommand(click.Command):
    """A command that remembers the words after a ``--`` click consumed."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            ctx.meta[_DASHDASH] = tuple(args[args.index("--") + 1 :])
        return super().parse_args(ctx, args)


def host_list_options(fn: F) -> F:
    """``-H``, with ``--python`` and ``--user`` standing in for an inventory's defaults."""
    decorators = [
        click.option(
            "-H",
            "--hosts",
            metavar="HOST:N,...",
            help=f"Hosts on the command line instead of an INVENTORY: {HOST_LIST_FORM}.",
        ),
        click.option(
            "--python", metavar="PATH", help="With -H: the interpreter with torch on the hosts."
        ),
        click.option("--user", metavar="NAME", help="With -H: the SSH user on the hosts."),
    ]
    for deco in reversed(decorators):
        fn = deco(fn)
    return fn


def split_hosts(
    ctx: click.Context, args: Sequence[str], kw: dict[str, Any], what: str
) -> tuple[Inventory, list[str], bool]:
    """(the hosts, the words after them, whether a ``--`` starts those words).

    With ``-H`` every word is the command's; else the first word is the inventory file.
    """
    rest = list(args)
    if kw["hosts"] is None:
        if kw["python"] is not None or kw["user"] is not None:
            raise UsageError(
                "--python and --user go with -H; with an inventory file, set `python:` and "
                "`user:` under its `defaults:`"
            )
        if not rest:
            raise UsageError(f"missing INVENTORY (or -H HOST:N,...) before {what}")
        # A file, or `slurm` / `slurm:JOBID` (a Slurm job's nodes), on --transport if given.
        environ = ctx.obj.environ if ctx.obj is not None else {}
        inventory = load_source(rest.pop(0), environ, kw.get("transport"))
    else:
        inventory = load_host_list(kw["hosts"], kw["python"], kw["user"])
    dashdash = bool(rest) and rest[0] == "--"
    if dashdash:
        rest = rest[1:]
    elif kw["hosts"] is not None and ctx.meta.get(_DASHDASH) == tuple(rest):
        dashdash = True  # `-H h:2 -- CMD`: click took the `--`
    return inventory, rest, dashdash


def source_of(inventory: Inventory, kw: dict[str, Any]) -> Optional[str]:
    """The inventory file, or None for hosts given with -H."""
    return None if kw["hosts"] is not None else inventory.source


def spares_option(fn: F) -> F:
    """``--spares HOST[:N],...``: hosts that take a bad host's node at launch."""
    return click.option(
        "--spares",
        metavar="HOST:N,...",
        help="Spare hosts (like -H; an inventory file's `spares:`): at launch, one takes the "
        "node rank of a host that is unreachable or quarantined, with the same process count.",
    )(fn)


def with_spares(inventory: Inventory, spares: Optional[str]) -> Inventory:
    """``inventory`` with the ``--spares`` hosts, if given."""
    if spares is None:
        return inventory
    if inventory.spares:
        raise UsageError(
            f"--spares and the `spares:` of {inventory.source} exclude each other; give the "
            "spares in one place"
        )
    return with_spare_list(inventory, spares)
