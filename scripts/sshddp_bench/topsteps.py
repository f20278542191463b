"""Case ``top_steps``: a CPU-bound training loop's steps per second with ``sshddp top``
open against without it (the issue's target: at least 0.99x).

The loop is ``steps``' (steady.py: 2 hosts x 1 rank, gloo on loopback). With top open, a
live ``sshddp top RUN`` runs from a new process, as from a second terminal, from the moment
node 0's run directory holds its state until the run ends: one call per host each second
(the nodes' samplers run in both cases: they are part of every run). Both kinds of run
alternate, each first in about half of the repetitions; the target is on each pair's ratio.
"""

from __future__ import annotations

import os
import resource
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
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
STREAMS_AT = 10.0  #: seconds after top's start that the nodes' streams' CPU is read
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class TopStepsRow:
    without: Stat  #: steps/s, nothing watching
    watched: Stat  #: steps/s, a live ``sshddp top`` open meanwhile
    ratio: Stat  #: each repetition's watched / without, run back to back
    views: Stat  #: the redraws each live top showed
    client: Stat = Stat(())  #: % of one core: the ``sshddp top`` process (the laptop's side)
    streams: Stat = Stat(())  #: % of one core: a node's ``node_top`` stream (a host's side)


def _streams_cpu(name: str) -> list[float]:
    """% of one core each live ``node_top`` stream of run ``name`` used since it started
    (argv ends RUNDIR/top; every lab host is this machine)."""
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            if not argv[-1].endswith(b"/top") or f"/runs/{name}/n".encode() not in argv[-1]:
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks, started = int(fields[11]) + int(fields[12]), int(fields[19]) / _TICK
        found.append(100.0 * ticks / _TICK / max(uptime - started, 1e-3))
    return found


class _LiveTop:
    """``sshddp top RUN``, live, from the moment the run has a state until it ends."""

    def __init__(self, b: Bench, name: str) -> None:
        self.b, self.name = b, name
        self.out: IO[bytes] = tempfile.TemporaryFile()
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.streams: list[float] = []  #: each stream's CPU, read STREAMS_AT s after the open
        self.client = 0.0  #: the top process's CPU, % of one core over its life
        self.opened = 0.0
        self.views = 0

    def open(self) -> None:
        state = run_dir(self.b, self.name, 0) / "state.json"
        deadline = time.monotonic() + OPEN_WAIT
        while not state.exists():
            if time.monotonic() > deadline:
                raise BenchError(f"run {self.name}: no state.json on node 0 to open top on")
            time.sleep(0.05)
        argv = [*self.b.sshddp, "top", "--ssh-config", self.b.ssh_config, self.name]
        self.opened = time.monotonic()
        self.proc = subprocess.Popen(argv, env=self.b.env, stdout=self.out, stderr=self.out)
        threading.Timer(STREAMS_AT, self._read_streams).start()

    def _read_streams(self) -> None:
        self.streams = _streams_cpu(self.name)

    def close(self) -> int:
        """The redraws it showed (it ends by itself once the run has ended)."""
        if self.proc is not None:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            try:
                self.proc.wait(timeout=15.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            used = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            self.client = 100.0 * used / (time.monotonic() - self.opened)
        self.out.seek(0)
        return self.out.read().count(f"sshddp top {self.name}".encode())


def steps_once(b: Bench, watched: bool) -> tuple[float, Optional[_LiveTop]]:
    """Rank 0's steps/s, and the live top that watched it (None without)."""
    port, name = b.port(), b.name("topsteps")
    inv = b.inventory(name, HOSTS, 1, port)
    launch = b.start(b.launch_argv(name, port, inv, "steps", str(STEPS)))
    top = _LiveTop(b, name) if watched else None
    if top is not None:
        top.open()
    done = expect_rc(launch.finish(), 0, "sshddp launch (steps)")
    if top is not None:
        top.views = top.close()
        if top.views < MIN_VIEWS:
            raise BenchError(f"the live top of {name} showed {top.views} views (< {MIN_VIEWS})")
    return steps_rate([t for _, t in done.lines]), top


def bench_top_steps(b: Bench, reps: int) -> TopStepsRow:
    rates: dict[str, list[float]] = {m: [] for m in METHODS}
    tops: list[_LiveTop] = []
    for rep in range(reps):
        for how in order(METHODS, rep):
            rate, top = steps_once(b, how != "without")
            rates[how].append(rate)
            tops += [top] if top is not None else []
    ratios = [w / z for w, z in zip(rates["with top"], rates["without"])]
    row = TopStepsRow(
        stat(rates["without"]),
        stat(rates["with top"]),
        stat(ratios),
        stat([float(t.views) for t in tops]),
        stat([t.client for t in tops]),
        stat([c for t in tops for c in t.streams]),
    )
    progress(
        f"steps/s: {row.without.fmt(1, 1)} without top, {row.watched.fmt(1, 1)} with it; "
        f"top {row.client.fmt()}% of a core, a node's stream {row.streams.fmt()}%"
    )
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
        f"Each live top redrew {r.views.fmt(1, 0)} times while its run went on. Its own CPU "
        f"(the laptop's side, here on the same 2 cores as the ranks): {r.client.fmt()}% of "
        f"one core; each node's `node_top` stream (a host's side): {r.streams.fmt()}%.",
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
