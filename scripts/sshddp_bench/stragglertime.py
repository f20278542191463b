"""Case ``straggler_time``: how long after a coupled run's straggler starts ``sshddp top``
names it (issue 45's want: within 30 s), and that a balanced run names nobody meanwhile.

The run is the straggler test's DDP loop (``tests/integration/payloads/straggler.py``: gloo,
gradients all-reduced every step) on 2 hosts x 2 ranks, detached, rank 3 sleeping 0.2 s a
step from its first one. The clock starts when every rank has printed its start line (the
ranks then step at once) and stops at the first ``sshddp top --json RUN`` whose
``stragglers`` names rank 3; top is asked once a second, as a user polling would.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from sshddp_bench.case import Case
from sshddp_bench.harness import (
    Bench,
    BenchError,
    Stat,
    expect_rc,
    progress,
    stat,
    verdict,
    wait_logs,
)
from sshddp_bench.top import stop_run

HOSTS = 2
NPROC = 2
STRAGGLER = 3  #: the rank that sleeps: the last one, on h2
TARGET_S = 30.0
GIVE_UP_S = 120.0
PAYLOAD = Path(__file__).parents[2] / "tests" / "integration" / "payloads" / "straggler.py"


@dataclass(frozen=True)
class StragglerTimeRow:
    detect: Stat  #: seconds from every rank's start to top naming the straggler
    calls: Stat  #: ``top --json`` calls it took


def _top(b: Bench, name: str) -> dict:
    argv = [*b.sshddp, "top", "--json", "--ssh-config", b.ssh_config, name]
    done = expect_rc(b.start(argv).finish(), 0, "sshddp top --json")
    return dict(json.loads("".join(text for _, text in done.lines)))


def _ranks_started(b: Bench, name: str) -> float:
    """When every rank had printed its start line (``rank N pid ...``), by the clock."""
    wait_logs(b, name, HOSTS, "rank ", HOSTS * NPROC, timeout=240.0)
    return time.monotonic()


def detect_once(b: Bench) -> tuple[float, int]:
    port, name = b.port(), b.name("straggle")
    inv = b.inventory(name, HOSTS, NPROC, port)
    argv = [*b.sshddp, "launch", "--detach", "--ssh-config", b.ssh_config, "--name", name]
    argv += ["--port", str(port), str(inv), str(PAYLOAD), "sleep", str(STRAGGLER)]
    expect_rc(b.start(argv).finish(), 0, "sshddp launch --detach (straggler)")
    try:
        started = _ranks_started(b, name)
        calls = 0
        while time.monotonic() - started < GIVE_UP_S:
            calls += 1
            named = [s["rank"] for s in _top(b, name)["stragglers"]]
            if named:
                if named != [STRAGGLER]:
                    raise BenchError(f"{name}: top named {named}, not rank {STRAGGLER}")
                return time.monotonic() - started, calls
            time.sleep(1.0)
        raise BenchError(f"{name}: no straggler named {GIVE_UP_S:g} s after the ranks started")
    finally:
        stop_run(b, name)


def bench_straggler_time(b: Bench, reps: int) -> StragglerTimeRow:
    found = [detect_once(b) for _ in range(reps)]
    row = StragglerTimeRow(stat([t for t, _ in found]), stat([float(c) for _, c in found]))
    progress(f"straggler named {row.detect.fmt()} s after the ranks started")
    return row


def table(r: StragglerTimeRow) -> list[str]:
    met = verdict(r.detect.median <= TARGET_S, f"{r.detect.median - TARGET_S:.1f} s over")
    return [
        f"A detached DDP run (gloo) of {HOSTS} hosts × {NPROC} ranks, rank {STRAGGLER} "
        "sleeping 0.2 s a step.",
        "",
        "| measure | value | target |",
        "|---|---|---|",
        f"| every rank started → `top --json` names rank {STRAGGLER} (s) | {r.detect.fmt()} "
        f"| ≤ {TARGET_S:g} s: {met} |",
        f"| `top --json` calls, one a second | {r.calls.fmt(digits=0)} | |",
    ]


METHOD = """\
* **straggler_time**: a detached run of the straggler test's DDP loop on {hosts} hosts ×
  {nproc} ranks, rank {rank} sleeping 0.2 s a step from its first. The clock starts once
  every rank's start line is in its node's `node.log` and stops at the first
  `sshddp top --json RUN` (asked once a second) whose `stragglers` names rank {rank}; any
  other rank named fails the case.
"""

CASE: Case[StragglerTimeRow] = Case(
    name="straggler_time",
    hosts=lambda sizes: HOSTS,
    run=lambda b, sizes, reps: bench_straggler_time(b, reps),
    title=lambda row: "how soon `top` names a coupled run's straggler",
    table=table,
    noisy=lambda row: ["straggler_time/detect"] if row.detect.noisy else [],
    method=lambda sizes: METHOD.format(hosts=HOSTS, nproc=NPROC, rank=STRAGGLER),
)
