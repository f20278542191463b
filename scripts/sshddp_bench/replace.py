"""Case ``replace``: a node lost mid-run and a spare seated in its place, from the loss to
every rank of the new world joined, against a plain ``--max-restarts`` restart of the same
run on the same hosts (a rank exits 1 once).

Both runs: 3 hosts × 2 ranks, detached, ``--max-restarts 1 --heartbeat-timeout 3``, each
host its own workdir (no shared disk), ``share: [ckpt.bin]`` (rank 0 writes 1 MiB in the
first attempt, so the second one starts with node 0's ``--share`` pull on the other nodes),
the rank program's ``replace`` mode. *replace*: a fourth host is the run's spare; once every
rank is up, node 2's host dies: every process of its node SIGKILLed, its sshd stopped and its
sessions killed, as ``test_spares_midrun`` does. *restart*: no spare; node 2's last rank
exits 1 (``replace fail``). The lost host is back (sshd started) before the next rep, and
``--ignore-quarantine`` keeps it in.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sshddp_bench.case import Case, Sizes
from sshddp_bench.harness import (
    Bench,
    BenchError,
    Stat,
    carries,
    expect_rc,
    kill_pids,
    progress,
    run_pids,
    stat,
)

HOSTS, NPROC = 3, 2
HEARTBEAT_S = 3.0  #: --heartbeat-timeout of both runs
LOST = 2  #: the node whose host dies (replace) or whose last rank fails (restart)
SPARE_SLOT = HOSTS  #: the spare's mesh slot (its run directory's n<slot>)
WAIT_S = 120.0  #: the longest a stage may take before the rep fails


@dataclass(frozen=True)
class Sample:
    """Seconds after the loss (the SIGKILL) or the failure (the FAIL line)."""

    halt: float  #: the first of nodes 0 and 1 told to stop (torchrun's "death signal")
    again: float  #: node 0 starts attempt 2: every node has stopped (its attempts.json)
    new_node: float  #: node 2's attempt 2 starts there (the spare's: it was seated)
    started: float  #: every rank of attempt 2 started (the last AGAIN line)
    joined: float  #: every rank of attempt 2 joined the process group (the last JOINED)
    pull: float  #: node 2's first AGAIN after its attempt's start: --share pull, torchrun


@dataclass(frozen=True)
class ReplaceRow:
    replaced: tuple[Sample, ...]  #: a spare in the lost node's place
    restarted: tuple[Sample, ...]  #: the same hosts again after a rank's failure

    def stage(self, name: str, how: str) -> Stat:
        samples = self.replaced if how == "replace" else self.restarted
        return stat([getattr(s, name) for s in samples])


def _dir(b: Bench, name: str, slot: int) -> Path:
    """Mesh slot ``slot``'s run directory: host h(slot+1)'s own workdir."""
    return b.tmp / "work" / name / f"h{slot + 1}" / "runs" / name / f"n{slot}"


def _inventory(b: Bench, name: str, port: int, spare: bool) -> Path:
    doc: dict[str, Any] = yaml.safe_load(b.inventory(name, HOSTS, NPROC, port).read_text())
    doc["defaults"].pop("workdir", None)
    doc["defaults"]["share"] = ["ckpt.bin"]
    for slot, entry in enumerate(doc["hosts"]):
        entry["workdir"] = str(b.tmp / "work" / name / f"h{slot + 1}")
    if spare:
        alias = b.cluster.host(SPARE_SLOT + 1).alias
        workdir = str(b.tmp / "work" / name / f"h{SPARE_SLOT + 1}")
        doc["spares"] = [{"host": alias, "nproc": NPROC, "workdir": workdir}]
    path = b.tmp / "inv" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _stamps(b: Bench, name: str, slots: list[int], word: str) -> list[float]:
    found: list[float] = []
    for slot in slots:
        with contextlib.suppress(OSError):
            text = (_dir(b, name, slot) / "node.log").read_text(errors="replace")
            found += [float(t) for t in re.findall(rf"{word} \d+ (\d+\.\d+)", text)]
    return found


def _wait(what: str, until: Any, name: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not until():
        if time.monotonic() > deadline:
            kill_pids(run_pids("SSHDDP_RUN_ID", name))
            raise BenchError(f"{name}: no {what} after {WAIT_S:.0f} s")
        time.sleep(0.02)


def _node_pids(name: str, slot: int, rundir: Path) -> list[int]:
    """The node's supervisor first, then torchrun and its workers (all hosts are this
    machine: the node's processes carry its run id and node rank)."""
    supervisor = int(json.loads((rundir / "state.json").read_text())["supervisor_pid"])
    needle = f"SSHDDP_NODE_RANK={slot}".encode()
    rest = [p for p in run_pids("SSHDDP_RUN_ID", name) if p != supervisor and carries(p, needle)]
    return [supervisor, *rest]


def _kill_host(b: Bench, name: str) -> float:
    """Node LOST's host dies: its sshd and sessions, then every process of its node; when
    the processes got SIGKILL."""
    from sshddp_lab.sshd import _connection_handlers

    host = b.cluster.host(LOST + 1)
    pids = _node_pids(name, LOST, _dir(b, name, LOST))
    b.cluster.stop_host(LOST + 1)
    for handler in _connection_handlers({(host.addr, host.port)}):
        with contextlib.suppress(ProcessLookupError):
            os.kill(handler.pid, signal.SIGKILL)
    t0 = time.time()  # the mesh between the supervisors is not sshd's: this is the loss
    kill_pids(pids)
    return t0


def _attempt_start(b: Bench, name: str, slot: int) -> float:
    record = json.loads((_dir(b, name, slot) / "attempts.json").read_text())
    return float(record["attempts"][-1]["started"])


def once(b: Bench, how: str) -> Sample:
    """One run: the loss (``replace``) or the failure (``restart``) of node LOST."""
    port, name = b.port(), b.name(f"rp-{how}")
    spare = how == "replace"
    inv = _inventory(b, name, port, spare)
    options = ["--detach", "--max-restarts", "1", "--heartbeat-timeout", f"{HEARTBEAT_S:g}"]
    options += ["--ignore-quarantine", "--grace", "2"]
    args = ["replace"] if spare else ["replace", "fail"]
    expect_rc(b.start(b.launch_argv(name, port, inv, *args, options=options)).finish(), 0, how)
    nodes = [0, 1, SPARE_SLOT] if spare else [0, 1, LOST]
    try:
        ready = lambda: len(_stamps(b, name, [0, 1, LOST], "READY")) >= HOSTS * NPROC  # noqa: E731
        _wait("READY from every rank", ready, name)
        if spare:
            t0 = _kill_host(b, name)
        else:
            _wait("FAIL", lambda: _fails(b, name), name)
            t0 = _fails(b, name)[0]
        _wait("JOINED", lambda: len(_stamps(b, name, nodes, "JOINED")) >= HOSTS * NPROC, name)
        ended = [_dir(b, name, n) / "exit.json" for n in nodes]
        _wait("end", lambda: all(p.exists() for p in ended), name)
    finally:
        if spare:
            b.cluster.start_host(LOST + 1)
    kill_pids(run_pids("SSHDDP_RUN_ID", name))  # none expected: a leftover of a failed rep
    new = _attempt_start(b, name, nodes[-1])
    first_again = min(_stamps(b, name, [nodes[-1]], "AGAIN"))
    return Sample(
        halt=min(_halts(b, name, t0)) - t0,
        again=_attempt_start(b, name, 0) - t0,
        new_node=new - t0,
        started=max(_stamps(b, name, nodes, "AGAIN")) - t0,
        joined=max(_stamps(b, name, nodes, "JOINED")) - t0,
        pull=first_again - new,
    )


#: torchrun's own line when its node is stopped (glog's prefix: local month, day, time)
_HALT_RE = re.compile(r"^[IWE](\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+) .*Received 15 death", re.M)


def _halts(b: Bench, name: str, t0: float) -> list[float]:
    """When nodes 0 and 1 were told to stop: torchrun's SIGTERM line, on this machine's
    clock (the year: ``t0``'s)."""
    year = time.localtime(t0).tm_year
    found = []
    for slot in (0, 1):
        text = (_dir(b, name, slot) / "node.log").read_text(errors="replace")
        for month, day, hour, minute, sec in _HALT_RE.findall(text):
            whole = time.mktime((year, int(month), int(day), int(hour), int(minute), 0, 0, 0, -1))
            found.append(whole + float(sec))
    if not found:
        raise BenchError(f"{name}: no torchrun stop line on nodes 0, 1")
    return found


def _fails(b: Bench, name: str) -> list[float]:
    with contextlib.suppress(OSError):
        text = (_dir(b, name, LOST) / "node.log").read_text(errors="replace")
        return [float(t) for t in re.findall(r"FAIL (\d+\.\d+)", text)]
    return []


def bench_replace(b: Bench, reps: int) -> ReplaceRow:
    runs: dict[str, list[Sample]] = {"replace": [], "restart": []}
    for rep in range(reps):
        for how in ("replace", "restart") if rep % 2 == 0 else ("restart", "replace"):
            runs[how].append(once(b, how))
    row = ReplaceRow(tuple(runs["replace"]), tuple(runs["restart"]))
    progress(
        f"replace: spare seated {row.stage('joined', 'replace').fmt()} s, "
        f"plain restart {row.stage('joined', 'restart').fmt()} s"
    )
    return row


STAGES = (
    ("halt", "detection: node 0 or 1 told to stop (torchrun's SIGTERM line)"),
    ("again", "halting: every node stopped, node 0 starts attempt 2 (attempts.json)"),
    ("new_node", "seating: node 2's attempt 2 starts on its host (spare: h4; attempts.json)"),
    ("started", "every rank of attempt 2 started (last AGAIN)"),
    ("joined", "**every rank of attempt 2 joined the process group (last JOINED)**"),
)


def replace_table(r: ReplaceRow) -> list[str]:
    out = [
        f"{HOSTS} hosts × {NPROC} ranks, detached, `--max-restarts 1 --heartbeat-timeout "
        f"{HEARTBEAT_S:g}`, a workdir per host and `share: [ckpt.bin]` (1 MiB). *Spare*: node "
        "2's host dies (every process of its node SIGKILLed, its sshd stopped, its sessions "
        "killed) and the spare h4 is seated in its place; *restart*: node 2's last rank exits 1 "
        "and the same hosts start again. Seconds after the SIGKILL (spare) or the FAIL line "
        "(restart):",
        "",
        "| stage | spare in a lost node's place (s) | plain restart, same hosts (s) |",
        "|---|---|---|",
    ]
    out += [
        f"| {text} | {r.stage(key, 'replace').fmt()} | {r.stage(key, 'restart').fmt()} |"
        for key, text in STAGES
    ]
    out.append(
        f"| of which on node 2: from its attempt's start to its first rank's AGAIN (the "
        f"`--share` pull, torchrun's start) | {r.stage('pull', 'replace').fmt()} | "
        f"{r.stage('pull', 'restart').fmt()} |"
    )
    halt = r.stage("halt", "replace")
    ok = halt.values and max(halt.values) <= HEARTBEAT_S + 1
    out += [
        "",
        f"Detection ≤ `--heartbeat-timeout` + 1 s ({HEARTBEAT_S + 1:g} s): "
        f"{'met' if ok else 'NOT met'} (worst {max(halt.values, default=float('nan')):.2f} s). "
        "A SIGKILLed supervisor's connection to node 0's closes at once, so node 0 learns of "
        "the loss without waiting for the heartbeat timeout; a host that goes silent with its "
        "connections open is found after the timeout (the `nodeloss` case, SIGSTOP).",
    ]
    return out


def replace_noisy(r: ReplaceRow) -> list[str]:
    return [f"replace/{how}" for how in ("replace", "restart") if r.stage("joined", how).noisy]


METHOD = """\
* **replace**: {hosts} hosts × {nproc} ranks (+ a spare for the spare runs), detached, with
  `--max-restarts 1 --heartbeat-timeout {hb} --ignore-quarantine`, a workdir per host and
  `share: [ckpt.bin]`; the rank program's `replace` mode (AGAIN at the next attempt's
  start, JOINED after gloo's `init_process_group`); a node is told to stop when its
  torchrun logs `Received 15 death signal` (glog's time, millisecond precision). Once
  every rank's READY is in its node.log, node 2's host dies (sshd stopped, its sessions
  and every process of its node SIGKILLed), or (restart) node 2's last rank exits 1.
  Stages from the node logs and each node's `attempts.json`, all hosts on this machine's
  clock. The two alternate, `--reps` times each.
"""


def method(sizes: Sizes) -> str:
    return METHOD.format(hosts=HOSTS, nproc=NPROC, hb=f"{HEARTBEAT_S:g}")


CASE: Case[ReplaceRow] = Case(
    name="replace",
    hosts=lambda sizes: HOSTS + 1,
    run=lambda b, sizes, reps: bench_replace(b, reps),
    title=lambda row: "A spare in a lost node's place, against a plain restart",
    table=replace_table,
    noisy=replace_noisy,
    method=method,
)
