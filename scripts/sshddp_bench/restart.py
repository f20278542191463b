"""Case ``restart``: ``--max-restarts`` across nodes: from the failing rank's exit to every
rank of the run running again, against torchrun's own restart of one node.

* sshddp: 3 hosts × 2 ranks, ``--max-restarts 1``; the last rank fails in attempt 1. Its
  torchrun exits, its supervisor tells node 0's, every supervisor stops its node, and all
  start a fresh torchrun together (each imports torch again, then a new rendezvous).
* torchrun: one node, 2 ranks, ``--standalone --max-restarts 1``: torchrun restarts its
  own workers in the same process (no new interpreter, no other node to wait for).

Both from the ``FAIL <time>`` line the failing rank prints just before it exits to the last
``AGAIN <rank> <time>`` line, which every rank of the next attempt prints at import.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass

from sshddp_bench.case import Case, Sizes
from sshddp_bench.harness import Bench, BenchError, Stat, expect_rc, progress, run_dir, stat
from sshddp_bench.harness import verdict as met

HOSTS, NPROC = 3, 2
TARGET_S = 1.0  #: the issue's target: within torchrun's own single-node restart + 1 s


@dataclass(frozen=True)
class RestartRow:
    sshddp: Stat  #: seconds from the failure to every rank of 3 hosts running again
    started: Stat  #: of which: from the failure to every node's fresh torchrun started
    torchrun: Stat  #: the same for torchrun's own restart of one node


def restart_gap(text: str, ranks: int) -> float:
    """From the FAIL time to the last AGAIN time in ``text`` (every rank's lines). Not
    anchored at a line's start: torchrun's own workers (``python -u``) write a line's text
    and its newline apart, so two ranks' lines can share one (``AGAIN 1 T1AGAIN 0 T0``)."""
    fail = re.search(r"FAIL (\d+\.\d+)", text)
    again = [float(t) for t in re.findall(r"AGAIN \d+ (\d+\.\d+)", text)]
    if fail is None or len(again) != ranks:
        raise BenchError(f"expected FAIL and {ranks} AGAIN lines, got:\n{text[-2000:]}")
    return max(again) - float(fail.group(1))


def sshddp_once(b: Bench) -> tuple[float, float]:
    port, name = b.port(), b.name("restart")
    inv = b.inventory(name, HOSTS, NPROC, port)
    argv = b.launch_argv(name, port, inv, "restart", options=["--max-restarts", "1"])
    expect_rc(b.start(argv, stdout_null=True).finish(), 0, "sshddp launch --max-restarts 1")
    logs = [(run_dir(b, name, n) / "node.log").read_text(errors="replace") for n in range(HOSTS)]
    total = restart_gap("\n".join(logs), HOSTS * NPROC)
    fail = float(re.findall(r"^FAIL (\d+\.\d+)", logs[-1], re.M)[0])
    starts = []
    for n in range(HOSTS):
        record = json.loads((run_dir(b, name, n) / "attempts.json").read_text())
        starts.append(float(record["attempts"][1]["started"]))
    return total, max(starts) - fail


def torchrun_once(b: Bench) -> float:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    argv += [str(NPROC), "--max-restarts", "1", str(b.rank_script), "restart"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=b.tmp, timeout=300)
    if done.returncode != 0:
        raise BenchError(f"torchrun --max-restarts 1 exited {done.returncode}:\n{done.stderr}")
    return restart_gap(done.stdout, NPROC)


def bench_restart(b: Bench, reps: int) -> RestartRow:
    ours, started, theirs = [], [], []
    for _ in range(reps):
        theirs.append(torchrun_once(b))
        total, fresh = sshddp_once(b)
        ours.append(total)
        started.append(fresh)
    row = RestartRow(stat(ours), stat(started), stat(theirs))
    progress(
        f"restart: sshddp {row.sshddp.fmt()} s (torchrun started again after "
        f"{row.started.fmt()} s), torchrun {row.torchrun.fmt()} s"
    )
    return row


def restart_table(r: RestartRow) -> list[str]:
    over = r.sshddp.median - r.torchrun.median
    return [
        "Seconds from the failing rank's exit (its FAIL line) to every rank running again "
        "(the last AGAIN line of the next attempt):",
        "",
        "| restart | seconds | target |",
        "|---|---|---|",
        f"| torchrun `--standalone --max-restarts 1`, 1 node × {NPROC} | "
        f"{r.torchrun.fmt()} | (the reference) |",
        f"| sshddp `--max-restarts 1`, {HOSTS} hosts × {NPROC} | {r.sshddp.fmt()} | "
        f"{met(over <= TARGET_S, f'{over - TARGET_S:.2f} s over')} (≤ torchrun + 1 s) |",
        f"| of which: until every node's fresh torchrun started (attempts.json) | "
        f"{r.started.fmt()} | |",
        "",
        "The rest is a cold torchrun on every node (a new interpreter importing torch, then "
        "the rendezvous), which torchrun's own restart, in the same process, does not pay.",
    ]


def restart_noisy(r: RestartRow) -> list[str]:
    return [f"restart/{k}" for k in ("sshddp", "started", "torchrun") if getattr(r, k).noisy]


METHOD = """\
* **restart**: the rank program's `restart` mode: in the first attempt the last rank prints
  `FAIL <time>` and exits 1, the others sleep; every rank of the second attempt prints
  `AGAIN <rank> <time>` at import. sshddp: {hosts} hosts × {nproc} ranks, `--max-restarts
  1` (node.log of every host read after the run); torchrun: one node, `--standalone
  --nproc-per-node {nproc} --max-restarts 1` (its stdout). From FAIL to the last AGAIN,
  {reps} times each, alternating.
"""


def method(sizes: Sizes) -> str:
    return METHOD.format(hosts=HOSTS, nproc=NPROC, reps="`--reps`")


CASE: Case[RestartRow] = Case(
    name="restart",
    hosts=lambda sizes: HOSTS,
    run=lambda b, sizes, reps: bench_restart(b, reps),
    title=lambda row: f"Restarts: every node again after a failure ({HOSTS} hosts)",
    table=restart_table,
    noisy=restart_noisy,
    method=method,
)
