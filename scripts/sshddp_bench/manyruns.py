"""Case ``runs256``: a detached run on 16, 64 and 256 hosts (``--many-sizes``): ``launch
--detach``, ``ps`` and ``stop``, with the coordinator's CPU and memory, against pdsh with
the same fan-out.

The run needs no torch on the hosts: ``--launcher=node --no-check`` starts the rank script
once a node (it sleeps), so the lab's 256 sshd on this machine can each hold a node. ``ps
NAME`` asks every host (the run is unfinished); its baseline is one pdsh that ``cat``s each
node's ``state.json`` on its own host. ``stop NAME`` ends every node; its baseline is pdsh
running ``true`` (the floor of any fan-out command at that count: no stop is cheaper than
reaching every host). After the stop, no process of the run may be left anywhere.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sshddp_bench.case import Case
from sshddp_bench.harness import (
    FANOUT,
    Bench,
    BenchError,
    Finished,
    Stat,
    expect_rc,
    kill_pids,
    order,
    progress,
    run_pids,
    stat,
    verdict,
)
from sshddp_bench.many import REFUSING, SILENT, hosts_down

#: past this many hosts the launch starts LAB_FANOUT supervisors at a time, not 32: the lab's
#: hosts share 2 cores and one /proc, and 32 supervisors starting at once beside 200 running
#: ones missed their 20 s start (2 runs at 256 hosts, 1 and 8 nodes); real hosts start theirs
#: on their own cores
LAB_HOSTS, LAB_FANOUT = 64, 16
#: past LAB_HOSTS hosts ps has this --connect-timeout: its answers are due within the connect
#: timeout plus 10 s from its start, for every host together (run/ps.py), and at 256 hosts
#: this lab's ps took 24 s (load average 40): 53 of 256 live nodes were named unreachable
LAB_PS_TIMEOUT = 30
GONE_S = 60.0  #: seconds every process of a stopped run has to end
PER_HOST_MS = 5.0  #: coordinator CPU a host may cost (issue 47's finding threshold)


@dataclass(frozen=True)
class RunsSize:
    hosts: int
    launch_wall: float  #: launch --detach (one, since each run is launched once)
    launch_cpu: float
    launch_rss: float
    ps_wall: Stat
    ps_cpu: Stat
    ps_rss: Stat
    pdsh_ps_wall: Stat  #: pdsh cat of each node's state.json
    stop_wall: float
    stop_cpu: float
    stop_rss: float
    pdsh_true_wall: Stat
    gone: float  #: seconds from stop's exit until no process of the run was left
    left: int  #: processes of the run alive GONE_S after the stop (killed then)
    #: ``ps --json`` with 5 hosts down (many.REFUSING, many.SILENT of those within the count):
    #: those hosts, the ones ps named unreachable, the nodes it found running, its wall time
    #: and its --connect-timeout
    down: tuple[str, ...] = ()
    down_named: tuple[str, ...] = ()
    down_running: int = 0
    down_wall: float = 0.0
    down_timeout: float = 0.0


def state_cat(b: Bench, name: str) -> str:
    """The remote command each host runs for the ps baseline: its own node's state.json
    (host hK holds node K-1)."""
    rundir = f"{b.tmp}/work/{name}/runs/{name}"
    return f"h=%h; cat {rundir}/n$((${{h#h}} - 1))/state.json"


def bench_size(b: Bench, n: int, reps: int) -> RunsSize:
    name, port = b.name("runs"), b.port()
    inv = b.inventory(name, n, 1, port)
    opts = ["--detach", "--launcher=node", "--no-check"]
    if n > LAB_HOSTS:
        opts += ["--fanout", str(LAB_FANOUT)]
    try:
        launch = expect_rc(
            b.start(b.launch_argv(name, port, inv, "sleep", options=opts)).finish(),
            0,
            f"launch --detach ({n} hosts)",
        )
        runs: dict[str, list[Finished]] = {"ps": [], "pdsh_ps": [], "pdsh_true": []}
        ps_argv = [*b.sshddp, "ps", "--json", "--ssh-config", b.ssh_config, name]
        if n > LAB_HOSTS:
            ps_argv[2:2] = ["--connect-timeout", str(LAB_PS_TIMEOUT)]
        for rep in range(reps):
            for what in order(tuple(runs), rep):
                if what == "ps":
                    done = expect_rc(b.start(ps_argv).finish(), 0, f"ps ({n} hosts)")
                    text = "\n".join(t for _, t in done.lines)
                    (row,) = json.loads(text)["runs"]
                    states = Counter(node["state"] for node in row["nodes"])
                    if states != Counter(running=n):
                        raise BenchError(f"ps ({n} hosts): not every node running: {states}")
                elif what == "pdsh_ps":
                    cmd = b.pdsh(n, state_cat(b, name))
                    done = expect_rc(b.start(cmd, stdout_null=True).finish(), 0, "pdsh cat")
                else:
                    cmd = b.pdsh(n, "true")
                    done = expect_rc(b.start(cmd, stdout_null=True).finish(), 0, "pdsh true")
                runs[what].append(done)
        down = ps_down(b, n, ps_argv)
        stop_argv = [*b.sshddp, "stop", "--ssh-config", b.ssh_config, name]
        stop = expect_rc(b.start(stop_argv).finish(), 0, f"stop ({n} hosts)")
    finally:
        t0 = time.monotonic()
        while run_pids("SSHDDP_RUN_ID", name) and time.monotonic() - t0 < GONE_S:
            time.sleep(0.2)
        gone = time.monotonic() - t0
        left = run_pids("SSHDDP_RUN_ID", name)
        kill_pids(left)
    ps, pdsh_ps, pdsh_true = runs["ps"], runs["pdsh_ps"], runs["pdsh_true"]
    size = RunsSize(
        hosts=n,
        launch_wall=launch.wall,
        launch_cpu=launch.cpu,
        launch_rss=launch.maxrss_mb,
        ps_wall=stat([r.wall for r in ps]),
        ps_cpu=stat([r.cpu for r in ps]),
        ps_rss=stat([r.maxrss_mb for r in ps]),
        pdsh_ps_wall=stat([r.wall for r in pdsh_ps]),
        stop_wall=stop.wall,
        stop_cpu=stop.cpu,
        stop_rss=stop.maxrss_mb,
        pdsh_true_wall=stat([r.wall for r in pdsh_true]),
        gone=gone,
        left=len(left),
        **down,
    )
    progress(
        f"runs256 {n} hosts: launch {launch.wall:.1f} s, ps {size.ps_wall.fmt()} s "
        f"(pdsh {size.pdsh_ps_wall.fmt()} s), stop {stop.wall:.1f} s, {len(left)} left"
    )
    return size


def ps_down(b: Bench, n: int, ps_argv: list[str]) -> dict[str, Any]:
    """``ps_argv`` once with 5 of the ``n`` hosts down (3 refusing connections, 2 whose sshd
    is SIGSTOPped); every host is up again afterwards. RunsSize's ``down*`` fields."""
    with hosts_down(b, n) as down:
        done = b.start(ps_argv).finish()
    (row,) = json.loads("\n".join(t for _, t in done.lines))["runs"]
    timeout = ps_argv[ps_argv.index("--connect-timeout") + 1] if n > LAB_HOSTS else "10"
    return {
        "down": down,
        "down_named": tuple(x["host"] for x in row["nodes"] if x["state"] == "unreachable"),
        "down_running": sum(1 for x in row["nodes"] if x["state"] == "running"),
        "down_wall": done.wall,
        "down_timeout": float(timeout),
    }


def bench_runs(b: Bench, counts: tuple[int, ...], reps: int) -> tuple[RunsSize, ...]:
    return tuple(bench_size(b, n, reps) for n in counts)


def ms(cpu: float, hosts: int) -> str:
    return f"{cpu / hosts * 1000:.1f}"


def size_line(s: RunsSize) -> str:
    return (
        f"| {s.hosts} | {s.launch_wall:.1f} | {s.launch_cpu:.2f} ({ms(s.launch_cpu, s.hosts)}) "
        f"| {s.launch_rss:.0f} | {s.ps_wall.fmt()} | {s.pdsh_ps_wall.fmt()} "
        f"| {s.ps_wall.median / s.pdsh_ps_wall.median:.2f}x "
        f"| {s.ps_cpu.fmt()} ({ms(s.ps_cpu.median, s.hosts)}) | {s.ps_rss.fmt(1, 0)} "
        f"| {s.stop_wall:.1f} | {s.stop_cpu:.2f} ({ms(s.stop_cpu, s.hosts)}) "
        f"| {s.pdsh_true_wall.fmt()} | {s.gone:.1f} | {s.left} |"
    )


def growth(rows: tuple[RunsSize, ...]) -> list[str]:
    """Each host's coordinator CPU between counts, for ps and stop: linear, and under
    PER_HOST_MS a host."""
    if len(rows) < 2:
        return ["One host count only: no growth measured."]
    lines = []
    for what, cpu in (
        ("launch --detach", lambda s: s.launch_cpu),
        ("ps", lambda s: s.ps_cpu.median),
        ("stop", lambda s: s.stop_cpu),
    ):
        steps = list(zip(rows, rows[1:]))
        costs = [(cpu(b) - cpu(a)) / (b.hosts - a.hosts) * 1000 for a, b in steps]
        each = ", ".join(f"{a.hosts}→{b.hosts}: {c:.1f}" for (a, b), c in zip(steps, costs))
        first = costs[0] if costs[0] > 0 else float("nan")
        linear = verdict(costs[-1] <= 1.5 * first, f"{costs[-1] / first:.1f}x the first")
        under = verdict(costs[-1] < PER_HOST_MS, f"{costs[-1]:.1f} ms")
        lines.append(
            f"* {what}: coordinator CPU a host (ms) {each}; the last step no dearer a host "
            f"than the first (≤ 1.5x): {linear}; under {PER_HOST_MS:.0f} ms a host: {under}."
        )
    return lines


def table(rows: tuple[RunsSize, ...]) -> list[str]:
    clean = all(s.left == 0 for s in rows)
    return [
        "| hosts | launch --detach (s) | its CPU (s, ms/host) | RSS (MB) | ps NAME (s) "
        "| pdsh cat state.json (s) | ps/pdsh | ps CPU (s, ms/host) | ps RSS (MB) "
        "| stop (s) | stop CPU (s, ms/host) | pdsh true (s) | all gone after stop (s) "
        "| left |",
        "|---:|---:|---|---:|---|---|---:|---|---|---:|---|---|---:|---:|",
        *(size_line(s) for s in rows),
        "",
        *growth(rows),
        "",
        "Nothing of a stopped run left on any host: " + verdict(clean, "processes were left"),
        *(down_line(s) for s in rows if s.down),
    ]


def down_line(s: RunsSize) -> str:
    others = s.hosts - len(s.down)
    ok = set(s.down_named) == set(s.down) and s.down_running == others
    return (
        f"\n{s.hosts} hosts with {len(s.down)} down ({', '.join(s.down)}), `ps --json "
        f"--connect-timeout {s.down_timeout:g} NAME`: {s.down_wall:.2f} s; unreachable named: "
        f"{', '.join(s.down_named) or 'none'}; running: {s.down_running} of {others} others. "
        "Target: the down hosts named, every other node running: "
        + verdict(ok, "see the line above")
    )


def noisy(rows: tuple[RunsSize, ...]) -> list[str]:
    return [f"runs256/{s.hosts}" for s in rows if s.ps_wall.noisy or s.pdsh_ps_wall.noisy]


METHOD = f"""\
* **runs256**: at each of `--many-sizes` (16,64,256) hosts, one run `launch --detach
  --launcher=node --no-check` of the rank script's `sleep` (once a node, no torch), then in
  rotating order, each repetition: `sshddp ps NAME` (every host asked), its baseline `pdsh
  -R exec -f {FANOUT}` running `cat` of that host's own node's `state.json`, and `pdsh ...
  true`; then `sshddp stop NAME` once, and the seconds until no process carrying the run's
  id is left on any host. CPU is user+sys of the command and the children it reaped; RSS
  the coordinator's peak (VmHWM). The launch and stop are measured once a count (a run is
  launched and stopped once). Past {LAB_HOSTS} hosts the launch has `--fanout {LAB_FANOUT}`
  (the lab's hosts share 2 cores: 32 supervisors starting at once beside 200 running ones
  missed their 20 s start) and ps `--connect-timeout {LAB_PS_TIMEOUT}` (ps waits for every
  answer until the connect timeout plus 10 s from its start, for all hosts together: at 256
  lab hosts it takes longer than the default's 20 s). Before the stop, once: the same ps
  with hosts {", ".join(map(str, REFUSING))} stopped (connection refused) and
  {", ".join(map(str, SILENT))} SIGSTOPped (those within the count), up again after.
"""

CASE: Case[tuple[RunsSize, ...]] = Case(
    name="runs256",
    hosts=lambda sizes: max(sizes.many),
    run=lambda b, sizes, reps: bench_runs(b, sizes.many, reps),
    title=lambda rows: (
        "many hosts: launch --detach, ps and stop at "
        + ", ".join(str(s.hosts) for s in rows)
        + " hosts"
    ),
    table=table,
    noisy=noisy,
    method=lambda sizes: METHOD,
)
