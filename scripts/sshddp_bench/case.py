"""What a benchmark case is: the interface a module fills in to join the suite.

A case module measures one thing and says how to show it: it defines a ``Case`` (its
``--only`` name, the hosts it needs, the function that measures, its report section, its
noisy rows and its paragraph of the *Method* section) and ``registry`` lists it. ``Sizes``
carries what the command line asked every case to run at.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

from sshddp_bench.harness import Bench

Row = TypeVar("Row")


@dataclass(frozen=True)
class Sizes:
    """What each case runs at, from the command line."""

    only: frozenset[str]  #: the ``--only`` names of the cases to run
    doctor: tuple[int, ...]  #: doctor: host counts
    launch: tuple[int, ...]  #: launch: host counts
    mb: int  #: logs: MB from one rank
    logs8_hosts: int
    logs8_mb: int  #: logs8: MB per host
    scale: int  #: scale32: hosts
    slurm: tuple[int, ...] = (3,)  #: slurm: nodes of the Slurm cluster (its own, in namespaces)
    stacks: int = 8  #: stacks: hosts (2 ranks each)
    workdir_mb: int = 200  #: workdir: MB of the shipped directory
    workdir_hosts: int = 4  #: workdir: hosts it ships to
    many: tuple[int, ...] = (16, 64, 256)  #: scale256: host counts


@dataclass(frozen=True)
class Case(Generic[Row]):
    """One benchmark: how to run it and how to report it. ``Row`` is what it measured."""

    name: str  #: its ``--only`` name
    hosts: Callable[[Sizes], int]  #: sshd servers it needs at these sizes
    run: Callable[[Bench, Sizes, int], Row]  #: measures, with this many repetitions
    title: Callable[[Row], str]  #: its report section's title, without the number
    table: Callable[[Row], list[str]]  #: its report section's lines
    noisy: Callable[[Row], list[str]]  #: labels of its rows whose max exceeds 1.5x their min
    method: Callable[[Sizes], str]  #: its bullet of the report's *Method* section
