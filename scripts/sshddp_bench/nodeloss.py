"""Case ``nodeloss``: one host's whole run is SIGKILLed or SIGSTOPped; how long until the
other hosts have no process of the run left.

The run is detached, so the supervisors alone must notice: SIGKILL closes the lost host's
connections at once, SIGSTOP leaves them open and silent, as a host that loses power.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass

from sshddp_bench.case import Case, Sizes
from sshddp_bench.harness import (
    Bench,
    BenchError,
    GonePoller,
    Stat,
    carries,
    expect_rc,
    kill_pids,
    node_ended,
    progress,
    run_dir,
    run_pids,
    stat,
    wait_logs,
)
from sshddp_bench.teardown import TD_HOSTS, TD_NPROC

NL_HEARTBEAT_S = 3.0  # --heartbeat-timeout of the node-loss runs


@dataclass(frozen=True)
class NodeLossSample:
    """Seconds after the lost host's processes were signalled."""

    first: float  #: the first other node's exit record
    others: float  #: the last other node's exit record
    gone: float  #: no process of the run left on the other hosts
    reason: str  #: node 0's exit.json reason


@dataclass(frozen=True)
class NodeLossRow:
    killed: tuple[NodeLossSample, ...]  #: SIGKILL: the kernel closes the lost host's sockets
    frozen: tuple[NodeLossSample, ...]  #: SIGSTOP: silent, as a powered-off host

    def stage(self, name: str, how: str) -> Stat:
        samples = self.killed if how == "kill" else self.frozen
        return stat([getattr(x, name) for x in samples])


def node_pids(b: Bench, name: str, node: int) -> list[int]:
    """Every live process of one node of the run: its supervisor (``state.json``) first,
    then each process carrying both the run id and ``SSHDDP_NODE_RANK=node`` (torchrun
    and its workers). All hosts are this machine, so a host's processes are told apart by
    their environment."""
    state = json.loads((run_dir(b, name, node) / "state.json").read_text())
    supervisor = int(state["supervisor_pid"])
    needle = f"SSHDDP_NODE_RANK={node}".encode()
    rest = [p for p in run_pids("SSHDDP_RUN_ID", name) if p != supervisor and carries(p, needle)]
    if len(rest) < 1 + TD_NPROC:  # torchrun and its workers
        raise BenchError(f"{name}: node {node} has only {rest} besides its supervisor")
    return [supervisor, *rest]


def start_sleepers(b: Bench, how: str) -> str:
    """A detached run of sleeping ranks, every rank up; returns its name."""
    port, name = b.port(), b.name(f"nl-{how}")
    inv = b.inventory(name, TD_HOSTS, TD_NPROC, port)
    options = ["--detach", "--heartbeat-timeout", f"{NL_HEARTBEAT_S:g}"]
    argv = b.launch_argv(name, port, inv, "sleep", options=options)
    expect_rc(b.start(argv).finish(), 0, "sshddp launch --detach (node loss)")
    wait_logs(b, name, TD_HOSTS, "READY", TD_HOSTS * TD_NPROC)
    return name


def nodeloss_once(b: Bench, how: str) -> NodeLossSample:
    """Every process of the last host's run gets SIGKILL (``kill``) or SIGSTOP (``stop``);
    until the other hosts have none left."""
    name = start_sleepers(b, how)
    lost = TD_HOSTS - 1
    pids = node_pids(b, name, lost)
    poller = GonePoller("SSHDDP_RUN_ID", name, exclude=frozenset(pids))
    signum = signal.SIGKILL if how == "kill" else signal.SIGSTOP
    t0 = time.time()
    for pid in pids:  # the supervisor first: it must not see its torchrun die
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    poller.start()
    poller.join(NL_HEARTBEAT_S * 3 + 30)
    kill_pids(pids)  # the frozen host's processes, started by this run
    if poller.gone_at is None:
        left = sorted(set(run_pids("SSHDDP_RUN_ID", name)) - set(pids))
        kill_pids(left)
        raise BenchError(f"node loss ({how}) {name}: the other hosts still had {left}")
    ended = [node_ended(run_dir(b, name, i)) for i in range(lost)]
    reason = str(json.loads((run_dir(b, name, 0) / "exit.json").read_text()).get("reason", ""))
    return NodeLossSample(min(ended) - t0, max(ended) - t0, poller.gone_at - t0, reason)


def bench_nodeloss(b: Bench, reps: int) -> NodeLossRow:
    runs: dict[str, list[NodeLossSample]] = {"kill": [], "stop": []}
    for rep in range(reps):
        for how in ("kill", "stop") if rep % 2 == 0 else ("stop", "kill"):
            runs[how].append(nodeloss_once(b, how))
    row = NodeLossRow(tuple(runs["kill"]), tuple(runs["stop"]))
    progress(
        f"node loss: SIGKILL {row.stage('gone', 'kill').fmt()} s, "
        f"SIGSTOP {row.stage('gone', 'stop').fmt()} s"
    )
    return row


STAGES = (
    ("first", "the first other node has stopped (its exit record)"),
    ("others", "every other node has stopped (exit records)"),
    ("gone", "**no process of the run left on the other hosts**"),
)


def nodeloss_table(r: NodeLossRow) -> list[str]:
    out = [
        f"{TD_HOSTS} hosts × {TD_NPROC} processes, detached (`--detach --heartbeat-timeout "
        f"{NL_HEARTBEAT_S:g}`), every rank sleeping. Every process of the last host's run "
        "(its supervisor first, then torchrun and its workers) is signalled at once. "
        "Seconds after the signal:",
        "",
        "| stage | SIGKILL: host's processes die (s) | SIGSTOP: host goes silent (s) |",
        "|---|---|---|",
    ]
    out += [
        f"| {text} | {r.stage(key, 'kill').fmt()} | {r.stage(key, 'stop').fmt()} |"
        for key, text in STAGES
    ]
    for how, samples in (("SIGKILL", r.killed), ("SIGSTOP", r.frozen)):
        if samples:
            out.append("")
            out.append(f"Node 0's reason, {how}: “{samples[0].reason}”.")
    out += [
        "",
        "SIGKILL is detected when the kernel closes the killed supervisor's connection to "
        "node 0's supervisor, whatever the timeout; SIGSTOP (a host that hangs or loses power "
        f"without closing its connections) only after `--heartbeat-timeout` ({NL_HEARTBEAT_S:g} "
        "s here, 30 s by default) of silence. No target is set for either; what follows "
        "detection is the same teardown as above.",
    ]
    return out


def nodeloss_noisy(r: NodeLossRow) -> list[str]:
    return [f"nodeloss/{how}" for how in ("kill", "stop") if r.stage("gone", how).noisy]


METHOD = """\
* **node loss**: {td_hosts} hosts × {td_nproc} processes launched with `--detach
  --heartbeat-timeout {hb}`, every rank sleeping. Once every rank's READY is in its node's
  `node.log`, every process of the last host's run — its supervisor (`supervisor_pid` in
  `state.json`) first, then each process with that run id and `SSHDDP_NODE_RANK=<node>` in
  its environment (torchrun, its workers) — gets SIGKILL (the kernel closes its sockets, as
  when a host's processes crash or are OOM-killed) or SIGSTOP (the host goes silent with its
  connections open, as on power loss or a network cut; only the heartbeat timeout can tell).
  Latency is from the signal until no process of the run is left on the other hosts (the
  frozen host's pids excluded, then killed). The hub counts silence from the last line it
  received and heartbeats come every min(1, timeout / 5) s, so a frozen host is noticed
  between 0.8x and 1x the timeout after the signal. The two variants alternate.
"""


def method(sizes: Sizes) -> str:
    return METHOD.format(td_hosts=TD_HOSTS, td_nproc=TD_NPROC, hb=f"{NL_HEARTBEAT_S:g}")


CASE: Case[NodeLossRow] = Case(
    name="nodeloss",
    hosts=lambda sizes: TD_HOSTS,
    run=lambda b, sizes, reps: bench_nodeloss(b, reps),
    title=lambda row: "Node loss",
    table=nodeloss_table,
    noisy=nodeloss_noisy,
    method=method,
)
