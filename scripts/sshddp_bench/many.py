"""Case ``scale256``: the commands that need no torch on the hosts, at 16, 64 and 256 hosts
(``--many-sizes``), against pdsh with the same fan-out; then 256 hosts with 5 down.

``exec -- true`` and ``doctor`` (its hosts' Python without torch: every check runs but
torch's, which fails on every host, so doctor exits 3) against ``pdsh -f 32 ... true``: wall
time, the coordinator's CPU (user+sys, with what it reaped) and peak RSS. Then the largest
count with 5 hosts down, 3 refusing connections and 2 whose sshd is stopped (SIGSTOP: TCP
connects, no SSH banner ever comes): ``exec --connect-timeout 5`` must name those 5, exit 4
and run the command on the others, within the timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass

from sshddp_bench.case import Case
from sshddp_bench.harness import (
    FANOUT,
    Bench,
    BenchError,
    Finished,
    Stat,
    expect_rc,
    order,
    progress,
    stat,
    verdict,
)

NO_TORCH_PYTHON = "/usr/bin/python3"  #: the hosts' Python for doctor: one without torch
PER_HOST_MS = 5.0  #: coordinator CPU a host may cost (the issue's finding threshold)
CONNECT_TIMEOUT = 5.0
REFUSING = (3, 77, 150)  #: of the largest count: listeners stopped
SILENT = (201, 256)  #: listeners SIGSTOPped


@dataclass(frozen=True)
class ManySize:
    hosts: int
    exec_wall: Stat
    exec_cpu: Stat  #: sshddp exec's user+sys seconds
    exec_rss: Stat  #: its peak RSS (MB)
    doctor_wall: Stat
    doctor_cpu: Stat
    doctor_rss: Stat
    pdsh_wall: Stat
    pdsh_cpu: Stat  #: pdsh and its ssh clients


@dataclass(frozen=True)
class DownRun:
    hosts: int
    down: tuple[str, ...]  #: the hosts taken down
    named: tuple[str, ...]  #: the hosts exec reported unreachable
    ran: int  #: hosts whose command exited 0
    rc: int
    wall: float
    timeout: float  #: --connect-timeout
    slowest: float  #: the longest a down host took to be named (its ``seconds`` in --json)
    all_up: float  #: the same command's median wall time with every host up
    #: doctor --json with the same hosts down: the hosts it could not probe, the hosts it
    #: probed, its exit status and wall time, and its median with every host up
    doctor_named: tuple[str, ...] = ()
    doctor_probed: int = 0
    doctor_rc: int = 0
    doctor_wall: float = 0.0
    doctor_all_up: float = 0.0


@dataclass(frozen=True)
class ManyRow:
    sizes: tuple[ManySize, ...]
    down: DownRun


def hosts_argv(b: Bench, n: int) -> list[str]:
    return ["--ssh-config", b.ssh_config, "-H", ",".join(b.aliases(n))]


def run_exec(b: Bench, n: int) -> Finished:
    argv = [*b.sshddp, "exec", *hosts_argv(b, n), "--", "true"]
    return expect_rc(b.start(argv, stdout_null=True).finish(), 0, f"sshddp exec ({n} hosts)")


def run_doctor(b: Bench, n: int) -> Finished:
    argv = [*b.sshddp, "doctor", "--python", NO_TORCH_PYTHON, "--port", str(b.port())]
    done = expect_rc(b.start([*argv, *hosts_argv(b, n)]).finish(), 3, f"doctor ({n} hosts)")
    summary = f"{n} failing check(s), 0 warning(s) on {n} host(s)"
    if not any(summary in text for _, text in done.lines):
        raise BenchError(f"doctor ({n} hosts): more failed than torch:\n{done.stderr[-2000:]}")
    return done


def run_pdsh(b: Bench, n: int) -> Finished:
    return expect_rc(b.start(b.pdsh(n, "true")).finish(), 0, f"pdsh true ({n} hosts)")


RUNS = {"exec": run_exec, "doctor": run_doctor, "pdsh": run_pdsh}


def bench_size(b: Bench, n: int, reps: int) -> ManySize:
    runs: dict[str, list[Finished]] = {name: [] for name in RUNS}
    for rep in range(reps):
        for name in order(tuple(RUNS), rep):
            runs[name].append(RUNS[name](b, n))
    e, d, p = runs["exec"], runs["doctor"], runs["pdsh"]
    size = ManySize(
        hosts=n,
        exec_wall=stat([r.wall for r in e]),
        exec_cpu=stat([r.cpu for r in e]),
        exec_rss=stat([r.maxrss_mb for r in e]),
        doctor_wall=stat([r.wall for r in d]),
        doctor_cpu=stat([r.cpu for r in d]),
        doctor_rss=stat([r.maxrss_mb for r in d]),
        pdsh_wall=stat([r.wall for r in p]),
        pdsh_cpu=stat([r.cpu for r in p]),
    )
    progress(
        f"scale256 {n} hosts: exec {size.exec_wall.fmt()} s ({size.exec_cpu.fmt()} s CPU), "
        f"doctor {size.doctor_wall.fmt()} s, pdsh {size.pdsh_wall.fmt()} s"
    )
    return size


@contextlib.contextmanager
def hosts_down(b: Bench, n: int) -> Iterator[tuple[str, ...]]:
    """5 of the ``n`` hosts down while the block runs (3 refusing connections, 2 whose sshd
    is SIGSTOPped), up again afterwards; their names."""
    refusing = [i for i in REFUSING if i <= n]
    silent = [i for i in SILENT if i <= n and i not in refusing]
    stopped = [pid for pid in (b.cluster.sshd_pid(i) for i in silent) if pid is not None]
    for i in refusing:
        b.cluster.stop_host(i)
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield tuple(f"h{i}" for i in sorted([*refusing, *silent]))
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        for i in refusing:
            b.cluster.start_host(i)


def bench_down(b: Bench, n: int, all_up: float, doctor_up: float = 0.0) -> DownRun:
    """``exec`` and ``doctor`` on ``n`` hosts, 5 of them down; every host is up again
    afterwards."""
    with hosts_down(b, n) as down:
        timeout = ["--connect-timeout", str(CONNECT_TIMEOUT)]
        argv = [*b.sshddp, "exec", "--json", *timeout, *hosts_argv(b, n), "--", "true"]
        done = b.start(argv).finish()
        doctor = [*b.sshddp, "doctor", "--json", *timeout, "--python", NO_TORCH_PYTHON]
        checked = b.start([*doctor, "--port", str(b.port()), *hosts_argv(b, n)]).finish()
    hosts = json.loads("\n".join(text for _, text in done.lines))["hosts"]
    named = tuple(h["host"] for h in hosts if h["status"] == "unreachable")
    ran = sum(1 for h in hosts if h["status"] == "ok" and h["exit"] == 0)
    slowest = max((h["seconds"] for h in hosts if h["status"] == "unreachable"), default=0.0)
    probes = json.loads("\n".join(text for _, text in checked.lines))["hosts"]
    run = DownRun(
        n,
        down,
        named,
        ran,
        done.rc,
        done.wall,
        CONNECT_TIMEOUT,
        slowest,
        all_up,
        doctor_named=tuple(h["host"] for h in probes if h["facts"] is None),
        doctor_probed=sum(1 for h in probes if h["facts"] is not None),
        doctor_rc=checked.rc,
        doctor_wall=checked.wall,
        doctor_all_up=doctor_up,
    )
    progress(
        f"scale256 {n} hosts, {len(down)} down: exec {done.wall:.2f} s, named {named}; "
        f"doctor {checked.wall:.2f} s, named {run.doctor_named}"
    )
    return run


def bench_many(b: Bench, counts: tuple[int, ...], reps: int) -> ManyRow:
    sizes = tuple(bench_size(b, n, reps) for n in counts)
    last = sizes[-1]
    return ManyRow(sizes, bench_down(b, last.hosts, last.exec_wall.median, last.doctor_wall.median))


def per_host_ms(cpu: Stat, hosts: int) -> float:
    return cpu.median / hosts * 1000


def size_line(s: ManySize) -> str:
    ratio = s.exec_wall.median / s.pdsh_wall.median
    return (
        f"| {s.hosts} | {s.exec_wall.fmt()} | {s.doctor_wall.fmt()} | {s.pdsh_wall.fmt()} "
        f"| {ratio:.2f}x | {s.exec_cpu.fmt()} | {per_host_ms(s.exec_cpu, s.hosts):.1f} "
        f"| {s.doctor_cpu.fmt()} | {per_host_ms(s.doctor_cpu, s.hosts):.1f} "
        f"| {s.pdsh_cpu.fmt()} | {s.exec_rss.fmt(1, 0)} | {s.doctor_rss.fmt(1, 0)} |"
    )


def slope(a: ManySize, b: ManySize, cpu: str) -> float:
    """Coordinator CPU (ms) each host from ``a``'s count to ``b``'s costs."""
    return (getattr(b, cpu).median - getattr(a, cpu).median) / (b.hosts - a.hosts) * 1000


def growth(row: ManyRow) -> list[str]:
    """How the coordinator's CPU grows: each host's cost between counts, then whether the
    last step costs more a host than the first (faster than linear) and whether a host
    costs PER_HOST_MS or more."""
    if len(row.sizes) < 2:
        return ["One host count only: no growth measured."]
    steps = list(zip(row.sizes, row.sizes[1:]))
    lines = []
    for cpu, what in (("exec_cpu", "exec"), ("doctor_cpu", "doctor")):
        costs = [slope(a, b, cpu) for a, b in steps]
        each = ", ".join(f"{a.hosts}→{b.hosts}: {c:.1f}" for (a, b), c in zip(steps, costs))
        linear = verdict(costs[-1] <= 1.5 * costs[0], f"{costs[-1] / costs[0]:.1f}x the first")
        under = verdict(costs[-1] < PER_HOST_MS, f"{costs[-1]:.1f} ms")
        lines.append(
            f"* {what}: coordinator CPU a host (ms) {each}; the last step no dearer a host "
            f"than the first (≤ 1.5x, linear): {linear}; under {PER_HOST_MS:.0f} ms a host: "
            f"{under}."
        )
    return lines


def title(row: ManyRow) -> str:
    counts = ", ".join(str(s.hosts) for s in row.sizes)
    return f"many hosts: exec and doctor at {counts} hosts, {len(row.down.down)} of them down"


def many_table(row: ManyRow) -> list[str]:
    d = row.down
    all_named = set(d.named) == set(d.down)
    in_time = d.slowest <= d.timeout + 1
    return [
        "| hosts | exec -- true (s) | doctor (s) | pdsh -f 32 true (s) | exec/pdsh "
        "| exec CPU (s) | ms/host | doctor CPU (s) | ms/host | pdsh+ssh CPU (s) "
        "| exec RSS (MB) | doctor RSS (MB) |",
        "|---:|---|---|---|---:|---|---:|---|---:|---|---|---|",
        *(size_line(s) for s in row.sizes),
        "",
        *growth(row),
        "",
        f"{d.hosts} hosts with {len(d.down)} down ({', '.join(d.down)}), `exec "
        f"--connect-timeout {d.timeout:g}`: exit {d.rc} in {d.wall:.2f} s ({d.all_up:.2f} s "
        f"with every host up); unreachable named: {', '.join(d.named) or 'none'}, the slowest "
        f"in {d.slowest:.2f} s; the command ran on {d.ran} of {d.hosts - len(d.down)} others. "
        "Target: all named, each within the timeout (+1 s), exit 4, the others run: "
        + verdict(
            all_named and d.rc == 4 and d.ran == d.hosts - len(d.down) and in_time,
            "see the line above",
        ),
        *doctor_down(d),
    ]


def doctor_down(d: DownRun) -> list[str]:
    if not d.doctor_all_up:
        return []  # a result stored before doctor was measured down
    others = d.hosts - len(d.down)
    return [
        "",
        f"The same hosts down, `doctor --json --connect-timeout {d.timeout:g}`: exit "
        f"{d.doctor_rc} in {d.doctor_wall:.2f} s ({d.doctor_all_up:.2f} s with every host up); "
        f"not probed (named): {', '.join(d.doctor_named) or 'none'}; probed: {d.doctor_probed} "
        f"of {others} others. Target: all named, the others probed: "
        + verdict(
            set(d.doctor_named) == set(d.down) and d.doctor_probed == others,
            "see the line above",
        ),
    ]


def noisy(row: ManyRow) -> list[str]:
    return [
        f"scale256/{s.hosts}"
        for s in row.sizes
        if s.exec_wall.noisy or s.doctor_wall.noisy or s.pdsh_wall.noisy
    ]


METHOD = f"""\
* **scale256**: at each of `--many-sizes` (16,64,256) hosts, the first N of one cluster
  (past 64 hosts the lab listens on 127.1.x.y), in rotating order: `sshddp exec --ssh-config
  cfg -H h1,..,hN -- true`, `sshddp doctor --python {NO_TORCH_PYTHON} --port P -H ...` (a
  Python without torch: every check runs, torch's fails everywhere; exit 3 expected, with no
  other failure) and `pdsh -R exec -f {FANOUT} -w h1,..,hN ssh -F cfg %h true`. CPU is user+sys
  of the command and the children it reaped (for pdsh: its ssh clients); RSS the
  coordinator's peak (VmHWM). Then at the largest count, hosts {", ".join(map(str, REFUSING))}
  stopped (connection refused) and {", ".join(map(str, SILENT))} SIGSTOPped (TCP connects, no
  banner): `exec --json --connect-timeout {CONNECT_TIMEOUT:g} ... -- true`, once, then
  `doctor --json --connect-timeout {CONNECT_TIMEOUT:g} --python {NO_TORCH_PYTHON} ...`, once.
"""

CASE: Case[ManyRow] = Case(
    name="scale256",
    hosts=lambda sizes: max(sizes.many),
    run=lambda b, sizes, reps: bench_many(b, sizes.many, reps),
    title=title,
    table=many_table,
    noisy=noisy,
    method=lambda sizes: METHOD,
)
