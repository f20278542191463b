"""Case ``top_steps``: a CPU-bound training loop's steps per second with ``sshddp top``
open against without it (the issue's target: at least 0.99x).

The loop is ``steps``' (steady.py: 2 hosts x 1 rank, gloo on loopback). With top open, a
live ``sshddp top RUN`` runs from a new process, as from a second terminal, from the moment
node 0's run directory holds its state until the run ends: one call per host each second
(the nodes' samplers run in both cases: they are part of every run). Both kinds of run
alternate, each first in about half of the repetitions; the target is on each pair's ratio.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import IO, Optional

from sshddp_bench.case import Case, Sizes
from sshddp_bench.harness import (
    Bench,
    BenchError,
    Stat,
    expect_rc,
    order,
    progress,
    run_dir,
    stat,
    verdict,
)
from sshddp_bench.steady import HOSTS, STEPS, STEPS_TARGET, ratio_cell, steps_rate

METHODS = ("without", "with top")
MIN_VIEWS = 5  #: redraws a live top must have shown for the run to count as watched
OPEN_WAIT = 60.0  #: seconds to wait for node 0's state before top is started


@dataclass(frozen=True)
class TopStepsRow:
    without: Stat  #: steps/s, nothing watching
    watched: Stat  #: steps/s, a live ``sshddp top`` open meanwhile
    ratio: Stat  #: each repetition's watched / without, run back to back
    views: Stat  #: the redraws each live top showed


class _LiveTop:
    """``sshddp top RUN``, live, from the moment the run has a state until it ends."""

    def __init__(self, b: Bench, name: str) -> None:
        self.b, self.name = b, name
        self.out: IO[bytes] = tempfile.TemporaryFile()
        self.proc: Optional[subprocess.Popen[bytes]] = None

    def open(self) -> None:
        state = run_dir(self.b, self.name, 0) / "state.json"
        deadline = time.monotonic() + OPEN_WAIT
        while not state.exists():
            if time.monotonic() > deadline:
                raise BenchError(f"run {self.name}: no state.json on node 0 to open top on")
            time.sleep(0.05)
        argv = [*self.b.sshddp, "top", "--ssh-config", self.b.ssh_config, self.name]
        self.proc = subprocess.Popen(argv, env=self.b.env, stdout=self.out, stderr=self.out)

    def close(self) -> int:
        """The redraws it showed (it ends by itself once the run has ended)."""
        if self.proc is not None:
            try:
                self.proc.wait(timeout=15.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.out.seek(0)
        return self.out.read().count(f"sshddp top {self.name}".encode())


def steps_once(b: Bench, watched: bool) -> tuple[float, int]:
    """Rank 0's steps/s, and the redraws of the live top that watched it (0 without)."""
    port, name = b.port(), b.name("topsteps")
    inv = b.inventory(name, HOSTS, 1, port)
    launch = b.start(b.launch_argv(name, port, inv, "steps", str(STEPS)))
    top = _LiveTop(b, name) if watched else None
    if top is not None:
        top.open()
    done = expect_rc(launch.finish(), 0, "sshddp launch (steps)")
    views = top.close() if top is not None else 0
    if top is not None and views < MIN_VIEWS:
        raise BenchError(f"the live top of {name} showed {views} views, fewer than {MIN_VIEWS}")
    return steps_rate([t for _, t in done.lines]), views


def bench_top_steps(b: Bench, reps: int) -> TopStepsRow:
    rates: dict[str, list[float]] = {m: [] for m in METHODS}
    views: list[float] = []
    for rep in range(reps):
        for how in order(METHODS, rep):
            rate, seen = steps_once(b, how != "without")
            rates[how].append(rate)
            views += [float(seen)] if seen else []
    ratios = [w / z for w, z in zip(rates["with top"], rates["without"])]
    row = TopStepsRow(stat(rates["without"]), stat(rates["with top"]), stat(ratios), stat(views))
    progress(f"steps/s: {row.without.fmt(1, 1)} without top, {row.watched.fmt(1, 1)} with it")
    return row


def top_steps_table(r: TopStepsRow) -> list[str]:
    ratio = r.watched.median / r.without.median
    return [
        "| without top (steps/s) | with a live `sshddp top` (steps/s) | ratio of medians "
        f"| target ≥ {STEPS_TARGET}x | paired ratio: median [interval, ≥ 95%] |",
        "|---|---|---:|---|---|",
        f"| {r.without.fmt(1, 1)} | {r.watched.fmt(1, 1)} | {ratio:.3f}x "
        f"| {verdict(ratio >= STEPS_TARGET, f'{ratio:.3f}x')} "
        f"| {ratio_cell(r.ratio, STEPS_TARGET)} |",
        "",
        f"Each live top redrew {r.views.fmt(1, 0)} times while its run went on.",
    ]


METHOD = f"""\
* **top_steps**: the `steps` loop ({HOSTS} hosts x 1 rank, {STEPS} timed steps) under
  `sshddp launch`, alone and with a live `sshddp top RUN` started from another process as
  soon as node 0's run directory has its state (it redraws once a second until the run
  ends, and must have redrawn at least {MIN_VIEWS} times), alternating; the target is on
  the ratio with / without.
"""


def method(sizes: Sizes) -> str:
    return METHOD


CASE: Case[TopStepsRow] = Case(
    name="top_steps",
    hosts=lambda sizes: HOSTS,
    run=lambda b, sizes, reps: bench_top_steps(b, reps),
    title=lambda row: "steps per second with `top` open",
    table=top_steps_table,
    noisy=lambda row: [f"top_steps/{k}" for k in ("without", "watched") if getattr(row, k).noisy],
    method=method,
)
