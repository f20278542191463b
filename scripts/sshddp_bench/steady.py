"""Cases ``steps`` and ``relay``: what sshddp costs a run once it is running, for hours.

``steps``: a CPU-bound training loop (gloo, 2 hosts x 1 rank) under ``sshddp launch``
against the same loop under plain torchrun started on each host by pdsh; the ratio of the
steps per second rank 0 measured, repetition by repetition. ``relay``: 2 hosts x 1 rank
printing 1,000 lines a second; the CPU of each node's supervisor (its output relay threads
are inside it) and of the launch session that streams node.log to the coordinator, read
from /proc over a steady window, as % of one core. Every host is this machine, so a node's
processes are in this /proc.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from sshddp_bench.case import Case
from sshddp_bench.harness import (
    Bench,
    BenchError,
    ReadyWatch,
    Stat,
    carries,
    expect_rc,
    median_interval,
    order,
    progress,
    run_dir,
    stat,
    verdict,
)

HOSTS = 2  #: one rank each: both cases
STEPS = 4000  #: the loop's timed steps: ~20 s at this machine's ~190 steps/s
STEPS_TARGET = 0.99  #: sshddp's steps/s at least this times plain torchrun's
RATE, PRINT_S = 1000, 24.0  #: lines a second each rank prints, and for how long
WINDOW = (4.0, 19.0)  #: seconds after every rank's READY: the steady window measured
RELAY_TARGET = 2.0  #: % of one core, per node
STEPS_METHODS = ("sshddp", "torchrun")


# --------------------------------------------------------------------------- pure parts


def ratio_cell(ratios: Stat, target: float) -> str:
    """``0.995x [0.981x, 1.010x] 94%``: the paired ratios' median, the interval around it
    (``median_interval``) and its coverage; met only when the interval's low end is at
    least ``target``, else how far below it reaches."""
    lo, hi, covered = median_interval(ratios.values)
    cell = f"{ratios.median:.3f}x [{lo:.3f}x, {hi:.3f}x] {covered:.0%}"
    return f"{cell}: {verdict(lo >= target, f'reaches {lo - target:+.3f}x below it')}"


def cpu_ticks(stat_text: str) -> int:
    """utime + stime (clock ticks) from the text of ``/proc/<pid>/stat``. The command
    name (field 2) is in parentheses and may hold spaces and parentheses itself, so the
    fields are counted from the last ``)``: utime and stime are fields 14 and 15."""
    fields = stat_text[stat_text.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def core_percent(ticks: int, seconds: float, hz: int) -> float:
    """``ticks`` of CPU over ``seconds`` of wall time, as % of one core."""
    return 100.0 * ticks / hz / seconds


def steps_rate(lines: Sequence[str]) -> float:
    """The ``STEPS <rate>`` rank 0 printed (anywhere on a line: sshddp prefixes it)."""
    for line in lines:
        found = re.search(r"STEPS (\d+(?:\.\d+)?)", line)
        if found:
            return float(found.group(1))
    raise BenchError(f"no STEPS line in the output:\n{chr(10).join(lines[-15:])}")


# --------------------------------------------------------------------------- steps


@dataclass(frozen=True)
class StepsRow:
    sshddp: Stat  #: steps/s under sshddp launch
    torchrun: Stat  #: steps/s under plain torchrun by pdsh
    ratio: Stat  #: each repetition's sshddp / torchrun, run back to back


def steps_sshddp(b: Bench) -> float:
    port, name = b.port(), b.name("steps")
    inv = b.inventory(name, HOSTS, 1, port)
    done = b.start(b.launch_argv(name, port, inv, "steps", str(STEPS))).finish()
    return steps_rate([t for _, t in expect_rc(done, 0, "sshddp launch (steps)").lines])


def steps_torchrun(b: Bench) -> float:
    """The same loop under torchrun on every host, started by pdsh: static rendezvous on
    host 1, no sshddp process anywhere."""
    port = b.port()
    scripts = b.tmp / "steps" / str(port)
    scripts.mkdir(parents=True)
    for node, alias in enumerate(b.aliases(HOSTS)):
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(HOSTS)]
        argv += ["--node-rank", str(node), "--nproc-per-node", "1", "--rdzv-backend", "static"]
        argv += ["--rdzv-endpoint", f"{b.cluster.hosts[0].addr}:{port}"]
        argv += [str(b.rank_script), "steps", str(STEPS)]
        line = f"cd {shlex.quote(str(scripts))} && exec env GLOO_SOCKET_IFNAME=lo "
        (scripts / f"node-{alias}.sh").write_text(line + shlex.join(argv) + "\n")
    done = b.start(b.pdsh(HOSTS, f"sh {shlex.quote(str(scripts))}/node-%h.sh")).finish()
    return steps_rate([t for _, t in expect_rc(done, 0, "torchrun by pdsh (steps)").lines])


def bench_steps(b: Bench, reps: int) -> StepsRow:
    rates: dict[str, list[float]] = {m: [] for m in STEPS_METHODS}
    for rep in range(reps):
        for how in order(STEPS_METHODS, rep):
            rates[how].append(steps_sshddp(b) if how == "sshddp" else steps_torchrun(b))
    ratios = [a / z for a, z in zip(rates["sshddp"], rates["torchrun"])]
    row = StepsRow(stat(rates["sshddp"]), stat(rates["torchrun"]), stat(ratios))
    progress(f"steps/s: sshddp {row.sshddp.fmt(1, 1)}, torchrun {row.torchrun.fmt(1, 1)}")
    return row


def steps_table(r: StepsRow) -> list[str]:
    ratio = r.sshddp.median / r.torchrun.median
    miss = f"{ratio:.3f}x"
    return [
        "| sshddp launch (steps/s) | plain torchrun by pdsh (steps/s) | ratio of medians "
        f"| target ≥ {STEPS_TARGET}x | paired ratio: median [interval, ≥ 95%] |",
        "|---|---|---:|---|---|",
        f"| {r.sshddp.fmt(1, 1)} | {r.torchrun.fmt(1, 1)} | {ratio:.3f}x "
        f"| {verdict(ratio >= STEPS_TARGET, miss)} | {ratio_cell(r.ratio, STEPS_TARGET)} |",
        "",
        "*Paired*: each repetition's sshddp / torchrun, the two run back to back (each first "
        "in about half of them); the interval is the order statistics around the median "
        "(distribution-free), and the paired cell says met only when its low end is at or "
        "above the target.",
    ]


STEPS_METHOD = f"""\
* **steps**: {HOSTS} hosts x 1 rank, gloo on loopback, one torch thread per rank: each step
  a 256x256 matmul (tanh) and an all-reduce of 64 Ki floats; {STEPS} timed steps between
  two barriers after 20 untimed ones, rank 0 prints the steps per second. Under `sshddp
  launch` against plain `torchrun` (static rendezvous on host 1) started on each host by
  pdsh, alternating; the target is on the ratio sshddp / torchrun.
"""

# --------------------------------------------------------------------------- relay


@dataclass(frozen=True)
class RelayRow:
    supervisor: Stat  #: % of one core, each node's supervisor (its relay threads inside)
    idle: Stat  #: % of one core, each node's supervisor while its rank prints nothing
    session: Stat  #: % of one core, each node's launch session streaming node.log
    lines: Stat  #: lines a second each rank printed over the window (from the coordinator)


def read_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return cpu_ticks(fh.read())


def supervisor_pid(b: Bench, name: str, node: int, timeout: float = 60.0) -> int:
    """Node ``node``'s supervisor, from its state.json, checked to carry the run's id."""
    path = run_dir(b, name, node) / "state.json"
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise BenchError(f"{name}: no state.json for node {node} after {timeout:.0f} s")
        time.sleep(0.05)
    pid = int(json.loads(path.read_text())["supervisor_pid"])
    if not carries(pid, f"SSHDDP_RUN_ID={name}".encode()):
        raise BenchError(f"{name}: node {node}'s supervisor pid {pid} is not of the run")
    return pid


def session_pid(supervisor: int) -> Optional[int]:
    """The launch session that forked the supervisor (its parent, while the session lives)."""
    with open(f"/proc/{supervisor}/stat") as fh:
        text = fh.read()
    ppid = int(text[text.rindex(")") + 2 :].split()[1])
    return ppid if ppid > 1 else None


def sample(pids: Sequence[int]) -> tuple[float, list[int]]:
    return time.monotonic(), [read_ticks(pid) for pid in pids]


def relay_once(b: Bench, rate: int) -> tuple[list[float], list[float], float]:
    """One run whose ranks print ``rate`` lines a second: (supervisor %, session %) per
    node over the window, and the lines a second per rank that reached the coordinator."""
    port, name = b.port(), b.name("relay")
    inv = b.inventory(name, HOSTS, 1, port)
    watch = ReadyWatch(HOSTS)
    proc = b.start(b.launch_argv(name, port, inv, "print", str(rate), str(PRINT_S)), watch)
    sups = [supervisor_pid(b, name, n) for n in range(HOSTS)]
    sessions = [session_pid(pid) for pid in sups]
    if None in sessions:
        raise BenchError(f"{name}: a node's launch session is gone: {sessions}")
    pids = sups + [pid for pid in sessions if pid is not None]
    while watch.all_at is None and not proc.done.is_set():
        time.sleep(0.05)
    if watch.all_at is None:
        expect_rc(proc.finish(), 0, "sshddp launch (print)")
        raise BenchError(f"{name}: only ranks {sorted(watch.ranks)} printed READY")
    time.sleep(max(0.0, watch.all_at + WINDOW[0] - time.perf_counter()))
    (t0, before), n0 = sample(pids), len(proc.lines)
    time.sleep(WINDOW[1] - WINDOW[0])
    (t1, after), n1 = sample(pids), len(proc.lines)
    expect_rc(proc.finish(), 0, "sshddp launch (print)")
    hz, wall = os.sysconf("SC_CLK_TCK"), t1 - t0
    pct = [core_percent(a - z, wall, hz) for a, z in zip(after, before)]
    return pct[:HOSTS], pct[HOSTS:], (n1 - n0) / wall / HOSTS


def bench_relay(b: Bench, reps: int) -> RelayRow:
    sup: list[float] = []
    idle: list[float] = []
    ses: list[float] = []
    rates: list[float] = []
    for rep in range(reps):
        for printing in (True, False) if rep % 2 == 0 else (False, True):
            s, t, rate = relay_once(b, RATE if printing else 0)
            if printing:
                sup, ses, rates = sup + s, ses + t, [*rates, rate]
            else:
                idle += s
    row = RelayRow(stat(sup), stat(idle), stat(ses), stat(rates))
    progress(f"relay: supervisor {row.supervisor.fmt(1, 2)} % of a core per node")
    return row


def relay_table(r: RelayRow) -> list[str]:
    worst = max(r.supervisor.values)
    miss = f"{worst:.2f} % at worst"
    return [
        "| lines/s per rank (seen) | supervisor, % of a core per node "
        f"| target ≤ {RELAY_TARGET:g} % (every node, every repetition) "
        "| launch session, % of a core per node | supervisor, ranks silent (%) |",
        "|---|---|---|---|---|",
        f"| {r.lines.fmt(1, 0)} | {r.supervisor.fmt(1, 2)} "
        f"| {verdict(worst <= RELAY_TARGET, miss)} | {r.session.fmt(1, 2)} "
        f"| {r.idle.fmt(1, 2)} |",
    ]


RELAY_METHOD = f"""\
* **relay**: {HOSTS} hosts x 1 rank, each printing {RATE} lines a second (one flushed
  write a line, paced against the clock) for {PRINT_S:.0f} s under `sshddp launch`, the
  coordinator reading every line. From {WINDOW[0]:.0f} s to {WINDOW[1]:.0f} s after every
  rank's READY, the CPU (utime + stime in `/proc/<pid>/stat`) of each node's supervisor (the
  pid its state.json names, checked to carry the run's `SSHDDP_RUN_ID`; the output relay
  threads are inside it) and of the launch session that forked it (it streams node.log to
  the coordinator), as % of one core. *lines/s* is what reached the coordinator's stdout.
  *ranks silent*: the same run with ranks that print nothing (alternating with it): the
  supervisor's cost that is not the relay's.
"""


STEPS_CASE: Case[StepsRow] = Case(
    name="steps",
    hosts=lambda sizes: HOSTS,
    run=lambda b, sizes, reps: bench_steps(b, reps),
    title=lambda row: f"Training steps per second, {HOSTS} hosts x 1 rank (CPU, gloo)",
    table=steps_table,
    noisy=lambda r: ["steps"] if r.sshddp.noisy or r.torchrun.noisy else [],
    method=lambda sizes: STEPS_METHOD,
)
RELAY_CASE: Case[RelayRow] = Case(
    name="relay",
    hosts=lambda sizes: HOSTS,
    run=lambda b, sizes, reps: bench_relay(b, reps),
    title=lambda row: f"Output relay CPU per node, {HOSTS} hosts x {RATE} lines/s",
    table=relay_table,
    noisy=lambda r: ["relay"] if r.supervisor.noisy else [],
    method=lambda sizes: RELAY_METHOD,
)
