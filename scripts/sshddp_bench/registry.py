"""The suite's cases by name, in the order they run and are numbered in the report.

A new case is a module that defines a ``Case`` (see ``case.py``) and one line in ``CASES``;
``--only``, the cluster's size, the report's sections, its noisy rows and its *Method*
section all follow from this list.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from sshddp_bench import (
    api,
    doctor,
    exec_true,
    fetch,
    floor,
    hang,
    health,
    launch,
    logs,
    many,
    manyruns,
    nodeloss,
    ps,
    replace,
    rescan,
    restart,
    scale,
    slurm,
    smoke_bw,
    stacks,
    startup,
    steady,
    stragglertime,
    sync,
    teardown,
    top,
    topsteps,
    workdir,
)
from sshddp_bench.case import Case, Sizes
from sshddp_bench.harness import Bench

CASES: tuple[Case[Any], ...] = (
    doctor.CASE,
    health.CASE,
    launch.CASE,
    floor.CASE,
    teardown.CASE,
    nodeloss.CASE,
    logs.LOGS,
    logs.LOGS8,
    scale.CASE,
    exec_true.CASE,
    many.CASE,
    smoke_bw.CASE,
    slurm.CASE,
    fetch.CASE,
    stacks.CASE,
    top.CASE,
    topsteps.CASE,
    stragglertime.CASE,
    ps.CASE,
    workdir.CASE,
    hang.CASE,
    restart.CASE,
    replace.CASE,
    steady.STEPS_CASE,
    steady.RELAY_CASE,
    startup.CASE,
    sync.CASE,
    sync.COLD_CASE,
    sync.OFFLINE_CASE,
    api.CASE,
    manyruns.CASE,
    rescan.CASE,
    sync.MANY_CASE,
)
NAMES = tuple(case.name for case in CASES)


def selected(sizes: Sizes) -> list[Case[Any]]:
    """The cases ``--only`` asked for, in suite order."""
    return [case for case in CASES if case.name in sizes.only]


def hosts_needed(sizes: Sizes) -> int:
    """sshd servers the cluster needs: as many as the largest selected case."""
    return max(case.hosts(sizes) for case in selected(sizes))


@dataclass(frozen=True)
class CaseFault:
    """A case that stopped on a fault (of the benchmark, or of sshddp): the report says so
    and the suite goes on with the next case, so one fault does not lose a whole run."""

    error: str


def run_cases(b: Bench, sizes: Sizes, reps: int) -> dict[str, Any]:
    """Every selected case's results, by case name, in suite order; each case's table is
    printed to stderr as it ends (the report itself comes at the end)."""
    rows: dict[str, Any] = {}
    for case in selected(sizes):
        try:
            rows[case.name] = row = case.run(b, sizes, reps)
        except Exception as exc:  # the report names it; the suite goes on
            rows[case.name] = CaseFault(f"{type(exc).__name__}: {exc}"[:2000])
            print(f"bench: case {case.name} stopped: {rows[case.name].error}", file=sys.stderr)
            continue
        print(
            "\n".join(["", f"## {case.title(row)}", *case.table(row)]), file=sys.stderr, flush=True
        )
    return rows
