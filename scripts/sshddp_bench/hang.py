"""Case ``hang``: how soon the watchdogs stop a hung run, with no coordinator.

A detached run of 3 hosts × 2 ranks hangs on purpose, and the time is taken from when the
hang became visible to when no process of the run is left (every process on this machine,
scanned by ``GonePoller``); the watchdog's timeout is subtracted, so what is left is what
sshddp adds: noticing (node 0 looks every second, the others' facts come with the
heartbeat), every node's stacks, and stopping every rank (SIGTERM, then the grace).

* stall: the ranks print READY and sleep, with ``--stall-timeout``; from the last READY
  line (each rank prints its time) to the run gone.
* init: node 1's ranks sleep before init_process_group, the others wait in it, with
  ``--init-timeout``; from node 0's supervisor's start (its state.json) to the run gone.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from sshddp_bench.case import Case, Sizes
from sshddp_bench.harness import (
    Bench,
    BenchError,
    GonePoller,
    Stat,
    expect_rc,
    progress,
    run_dir,
    stat,
    verdict,
    wait_logs,
)

HOSTS, NPROC = 3, 2
STALL_S = 5.0  #: --stall-timeout
INIT_S = 20.0  #: --init-timeout: beyond torch's import time on a loaded machine
TARGET_S = 2.0  #: the issue's target: stopped within the timeout + 2 s


@dataclass(frozen=True)
class HangRow:
    stall: Stat  #: seconds past --stall-timeout until the run was gone
    init: Stat  #: seconds past --init-timeout until the run was gone


def _run(b: Bench, mode: str, options: list[str]) -> tuple[str, GonePoller]:
    port, name = b.port(), b.name(f"hang-{mode}")
    inv = b.inventory(name, HOSTS, NPROC, port)
    argv = b.launch_argv(name, port, inv, mode, options=["--detach", *options])
    expect_rc(b.start(argv).finish(), 0, f"sshddp launch --detach ({mode})")
    poller = GonePoller("SSHDDP_RUN_ID", name)
    poller.start()
    wait_logs(b, name, HOSTS, "READY", HOSTS * NPROC, timeout=240.0)
    poller.join(240.0)
    if poller.gone_at is None:
        raise BenchError(f"{name}: the watchdog did not stop the run within 240 s")
    for node in range(HOSTS):
        ended = json.loads((run_dir(b, name, node) / "exit.json").read_text())
        if ended["state"] != "stalled":
            raise BenchError(f"{name}: node {node} ended {ended['state']}: {ended['reason']}")
    return name, poller


def stall_once(b: Bench) -> float:
    name, poller = _run(b, "sleep", ["--stall-timeout", str(STALL_S)])
    last = 0.0
    for node in range(HOSTS):
        text = (run_dir(b, name, node) / "node.log").read_text(errors="replace")
        last = max([last, *(float(t) for t in re.findall(r"READY \d+ (\d+\.\d+)", text))])
    assert poller.gone_at is not None
    return poller.gone_at - last - STALL_S


def init_once(b: Bench) -> float:
    name, poller = _run(b, "initblock", ["--init-timeout", str(INIT_S)])
    state = json.loads((run_dir(b, name, 0) / "state.json").read_text())
    assert poller.gone_at is not None
    return poller.gone_at - float(state["started"]) - INIT_S


def bench_hang(b: Bench, reps: int) -> HangRow:
    stall = [stall_once(b) for _ in range(reps)]
    init = [init_once(b) for _ in range(reps)]
    row = HangRow(stat(stall), stat(init))
    progress(f"hang: stall +{row.stall.fmt()} s, init +{row.init.fmt()} s past the timeout")
    return row


def hang_table(r: HangRow) -> list[str]:
    def target(s: Stat) -> str:
        return verdict(s.median <= TARGET_S, f"{s.median - TARGET_S:.2f} s over")

    return [
        f"A detached run of {HOSTS} hosts × {NPROC} ranks that hangs; seconds from the hang "
        "becoming visible, less the timeout, to no process of the run left:",
        "",
        "| watchdog | past the timeout (s) | target ≤ 2 s |",
        "|---|---|---|",
        f"| `--stall-timeout {STALL_S:g}` (last output -> run gone) | {r.stall.fmt()} | "
        f"{target(r.stall)} |",
        f"| `--init-timeout {INIT_S:g}` (node 0 started -> run gone) | {r.init.fmt()} | "
        f"{target(r.init)} |",
    ]


def hang_noisy(r: HangRow) -> list[str]:
    return [f"hang/{k}" for k in ("stall", "init") if getattr(r, k).noisy]


METHOD = """\
* **hang**: detached runs of {hosts} hosts × {nproc} ranks of the rank program: `sleep`
  with `--stall-timeout {stall:g}` (from the last READY time a rank printed), and
  `initblock` (node 1 sleeps before init_process_group) with `--init-timeout {init:g}` (from
  node 0's supervisor start, its state.json), {reps} times each, until no process carrying
  the run's id is left; every node must end `stalled`. The timeout is subtracted.
"""


def method(sizes: Sizes) -> str:
    return METHOD.format(hosts=HOSTS, nproc=NPROC, stall=STALL_S, init=INIT_S, reps="`--reps`")


CASE: Case[HangRow] = Case(
    name="hang",
    hosts=lambda sizes: HOSTS,
    run=lambda b, sizes, reps: bench_hang(b, reps),
    title=lambda row: f"Watchdogs: a hung run stopped ({HOSTS * NPROC} ranks on {HOSTS} hosts)",
    table=hang_table,
    noisy=hang_noisy,
    method=method,
)
