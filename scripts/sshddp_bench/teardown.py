"""Case ``teardown``: a rank fails; how long until no process of the run is left.

Measured attached (``sshddp launch`` follows the run) and detached (``--detach``: only the
supervisors on the hosts stop it), against the same job under pdsh, which never stops the
other nodes. ``TD_HOSTS`` and ``TD_NPROC`` are also the node-loss case's job.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from sshddp_bench.baselines import baseline_argv, dry_run, node_scripts
from sshddp_bench.case import Case, Sizes
from sshddp_bench.harness import (
    Bench,
    BenchError,
    GonePoller,
    ReadyWatch,
    Stat,
    Watched,
    expect_rc,
    kill_pids,
    node_ended,
    progress,
    run_dir,
    run_pids,
    stamp,
    stat,
    verdict,
    wait_logs,
)

TD_HOSTS, TD_NPROC = 3, 2  # teardown and node-loss runs
TARGET_S = 0.5  #: no process of the run left within this (median), attached and detached
TARGET_RATIO = 0.8  #: ... and within this much of torchrun tearing down its own node


@dataclass(frozen=True)
class TeardownSample:
    """Seconds after the FAIL line (all clocks are this machine's)."""

    failed_node: float  #: the failing node's exit record (its torchrun has exited)
    others: float  #: the last other node's exit record (its torchrun stopped)
    gone: float  #: no process of the run left
    exit: float  #: sshddp exited (nan when detached: it had returned before)


@dataclass(frozen=True)
class TeardownRow:
    attached: tuple[TeardownSample, ...]
    detached: tuple[TeardownSample, ...]
    pdsh_survivors: str
    torchrun: tuple[float, ...] = ()  #: one node's torchrun: FAIL -> none of its processes left

    def stage(self, name: str, detached: bool = False) -> Stat:
        return stat([getattr(x, name) for x in (self.detached if detached else self.attached)])

    @property
    def baseline(self) -> Stat:
        return stat(list(self.torchrun))


def teardown_sample(
    b: Bench, name: str, fail: float, gone: float, exit_at: float
) -> TeardownSample:
    ended = [node_ended(run_dir(b, name, i)) for i in range(TD_HOSTS)]
    return TeardownSample(
        failed_node=ended[-1] - fail,
        others=max(ended[:-1]) - fail,
        gone=gone - fail,
        exit=exit_at - fail,
    )


def teardown_once(b: Bench) -> TeardownSample:
    port, name = b.port(), b.name("td")
    inv = b.inventory(name, TD_HOSTS, TD_NPROC, port)
    poller = GonePoller("SSHDDP_RUN_ID", name)
    # The poller starts once every rank is up: started earlier, it would find no process
    # of the run yet and call the run gone.
    watch = ReadyWatch(TD_HOSTS * TD_NPROC, on_all=poller.start)
    proc = b.start(b.launch_argv(name, port, inv, "teardown"), on_line=watch)
    done = expect_rc(proc.finish(), 1, "sshddp launch (teardown)")
    exit_at = time.time()
    poller.join(30.0)
    if watch.fail_ts is None or poller.gone_at is None:
        survivors = run_pids("SSHDDP_RUN_ID", name)
        raise BenchError(
            f"teardown {name}: FAIL={watch.fail_ts}, left: {survivors}\n{done.stderr[-2000:]}"
        )
    return teardown_sample(b, name, watch.fail_ts, poller.gone_at, exit_at)


def teardown_detached_once(b: Bench) -> TeardownSample:
    """The same failing job launched with ``--detach``: the supervisors alone tear it down."""
    port, name = b.port(), b.name("tdd")
    inv = b.inventory(name, TD_HOSTS, TD_NPROC, port)
    argv = b.launch_argv(name, port, inv, "teardown", options=["--detach"])
    expect_rc(b.start(argv).finish(), 0, "sshddp launch --detach (teardown)")
    poller = GonePoller("SSHDDP_RUN_ID", name)
    wait_logs(b, name, TD_HOSTS, "READY", TD_HOSTS * TD_NPROC)
    poller.start()
    poller.join(60.0)
    failing = run_dir(b, name, TD_HOSTS - 1) / "node.log"
    fail = stamp(failing.read_text(), "FAIL")
    if poller.gone_at is None:
        survivors = run_pids("SSHDDP_RUN_ID", name)
        raise BenchError(f"detached teardown {name}: left after 60 s: {survivors}")
    return teardown_sample(b, name, fail, poller.gone_at, float("nan"))


def torchrun_once(b: Bench) -> float:
    """The same failing rank under one node's own torchrun (``--standalone``, 2 ranks):
    seconds from its FAIL line to no process of that torchrun left (the baseline)."""
    name = b.name("td-torchrun")
    poller = GonePoller("BENCH_RUN", name)
    watch = ReadyWatch(TD_NPROC, on_all=poller.start)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    argv += [str(TD_NPROC), str(b.rank_script), "teardown"]
    proc = Watched(argv, {**b.env, "BENCH_RUN": name}, b.tmp, watch, False)
    done = expect_rc(proc.finish(), 1, "torchrun --standalone (teardown)")
    poller.join(30.0)
    if watch.fail_ts is None or poller.gone_at is None:
        seen = f"READY from ranks {sorted(watch.ranks)}, FAIL {watch.fail_ts is not None}"
        tail = " | ".join(line for _t, line in done.lines[-5:])
        raise BenchError(
            f"torchrun teardown {name}: {seen}; left: {run_pids('BENCH_RUN', name)}; "
            f"its last lines: {tail}"
        )
    return poller.gone_at - watch.fail_ts


def pdsh_survivors(b: Bench) -> str:
    """The same failing job under pdsh: what is still running 3 s after the failure."""
    port, name = b.port(), b.name("td-pdsh")
    inv = b.inventory(name, TD_HOSTS, TD_NPROC, port)
    nodes = dry_run(b, name, port, inv, "teardown")
    # BENCH_RUN=<name> in every node's environment: how its processes are found, then killed.
    argv = baseline_argv(b, "pdsh", TD_HOSTS, node_scripts(b, nodes, name, f"BENCH_RUN={name}"))
    watch = ReadyWatch(TD_HOSTS * TD_NPROC)
    proc = b.start(argv, on_line=watch)
    deadline = time.monotonic() + 60
    while watch.fail_ts is None and time.monotonic() < deadline and not proc.done.is_set():
        time.sleep(0.05)
    time.sleep(3.0)
    left = run_pids("BENCH_RUN", name)
    running = not proc.done.is_set()
    kill_pids(left)  # the processes this benchmark started, by pid
    proc.finish()
    return (
        f"{len(left)} processes of the run still alive 3 s after the failure, "
        f"pdsh {'still waiting' if running else 'exited'}"
    )


def bench_teardown(b: Bench, reps: int) -> TeardownRow:
    attached, detached, torchrun = [], [], []
    for rep in range(reps):  # alternate which variant goes first
        order = ("attached", "detached", "torchrun")
        for how in order if rep % 2 == 0 else order[::-1]:
            if how == "attached":
                attached.append(teardown_once(b))
            elif how == "detached":
                detached.append(teardown_detached_once(b))
            else:
                torchrun.append(torchrun_once(b))
    row = TeardownRow(tuple(attached), tuple(detached), pdsh_survivors(b), tuple(torchrun))
    progress(
        f"teardown: attached {row.stage('gone').fmt()} s, detached "
        f"{row.stage('gone', detached=True).fmt()} s, one node's torchrun "
        f"{row.baseline.fmt()} s; pdsh: {row.pdsh_survivors}"
    )
    return row


TEARDOWN_STAGES = (
    ("failed_node", "the failing node's torchrun has exited (its exit record)"),
    ("others", "the other nodes have stopped (SIGTERM, torchrun exits; exit records)"),
    ("gone", "**no process of the run left** (`SSHDDP_RUN_ID` in /proc/*/environ)"),
    ("exit", "sshddp has exited"),
)


def targets(r: TeardownRow) -> list[str]:
    """The target's lines for each variant that ran: under TARGET_S, and within
    TARGET_RATIO of one node's torchrun tearing down its own workers."""
    out = []
    base = r.baseline.median if r.torchrun else None
    for label, detached in (("attached", False), ("detached", True)):
        if not (r.detached if detached else r.attached):
            continue
        med = r.stage("gone", detached).median
        line = (
            f"Target, {label}: no process left within {TARGET_S} s (median): "
            f"{verdict(med < TARGET_S, f'{med:.2f} s, {med - TARGET_S:.2f} s over')}"
        )
        if base:
            ratio = med / base
            line += (
                f"; ≤ {TARGET_RATIO}x one node's torchrun ({ratio:.2f}x): "
                f"{verdict(ratio <= TARGET_RATIO, f'{ratio - TARGET_RATIO:.2f}x over')}"
            )
        out.append(line + ".")
    return out


def teardown_table(r: TeardownRow) -> list[str]:
    out = [
        f"{TD_HOSTS} hosts × {TD_NPROC} processes; the last rank prints `FAIL <time>` and "
        "raises. Seconds after that line (the node stages are the `ended` times of the "
        "nodes' `exit.json`). Attached: `sshddp launch` follows the run; detached: "
        "`sshddp launch --detach` has returned and no coordinator is connected, the "
        "supervisors stop the run on their own:",
        "",
        "| stage | attached (s) | detached (s) |",
        "|---|---|---|",
    ]
    for key, text in TEARDOWN_STAGES:
        det = r.stage(key, detached=True).fmt() if key != "exit" and r.detached else "-"
        out.append(f"| {text} | {r.stage(key).fmt()} | {det} |")
    if r.torchrun:
        out += [
            "",
            f"Baseline, same run: one node's torchrun (`--standalone --nproc-per-node "
            f"{TD_NPROC}`) tearing down its own workers after the same failure, FAIL → no "
            f"process of it left: {r.baseline.fmt()} s.",
        ]
    out.append("")
    out += targets(r)
    out += [
        "",
        f"pdsh, same job: never torn down — pdsh does not stop the other nodes when one "
        f"fails ({r.pdsh_survivors}).",
    ]
    return out


def teardown_noisy(r: TeardownRow) -> list[str]:
    found = []
    if r.stage("gone").noisy:
        found.append("teardown/attached")
    if r.stage("gone", detached=True).noisy:
        found.append("teardown/detached")
    return found


METHOD = """\
* **teardown**: {td_hosts} hosts × {td_nproc} processes; the last rank prints
  `FAIL <time.time()>` 1 s after READY and raises, the others sleep. Latency is from that
  timestamp until no process whose `/proc/<pid>/environ` holds `SSHDDP_RUN_ID=<run id>` is
  left (the run's pids re-checked every 10 ms; /proc rescanned every 100 ms and to confirm).
  sshddp runs with its default `--grace` (10 s). The node stages are the `ended` times in
  each node's `exit.json`. *Attached* is `sshddp launch` following the run (it exits 1);
  *detached* is `sshddp launch --detach`, which has returned before the ranks start, so only
  the supervisors (node 0's hub and its peers) stop the run; the `FAIL` timestamp is read
  from the failing node's `node.log` on its host. The two variants alternate.
"""


def method(sizes: Sizes) -> str:
    return METHOD.format(td_hosts=TD_HOSTS, td_nproc=TD_NPROC)


CASE: Case[TeardownRow] = Case(
    name="teardown",
    hosts=lambda sizes: TD_HOSTS,
    run=lambda b, sizes, reps: bench_teardown(b, reps),
    title=lambda row: "Teardown after a rank fails",
    table=teardown_table,
    noisy=teardown_noisy,
    method=method,
)
