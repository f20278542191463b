"""Case ``startup``: how long the command line takes to start, before it reaches any host.

Every launch waits for the coordinator's own start before its first connection or job step
(docs/performance.md): its interpreter, the CLI's modules and, over SSH, paramiko. This
case times commands that reach no host, each a new process run to its exit, against the
bare interpreter they start in:

* ``python -c pass``: the venv's interpreter with its site packages, the floor;
* ``sshddp --version`` and ``sshddp ps`` (an empty run registry);
* ``sshddp launch --dry-run`` onto ``-H`` hosts and from a YAML inventory: everything a
  launch does before it connects (reading the inventory, ssh_config through paramiko, the
  plan), then the plan printed instead of run.

No target: it says where a launch's first fraction of a second goes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from sshddp_bench.case import Case
from sshddp_bench.harness import Bench, Finished, Stat, expect_rc, progress, stat

RUNS_PER_REP = 4  #: each command runs this many times per --reps: one run is ~0.1 s


@dataclass(frozen=True)
class StartRow:
    label: str
    wall: Stat  #: seconds from Popen to exit
    cpu: Stat  #: user + sys seconds


def commands(b: Bench) -> list[tuple[str, list[str]]]:
    ssh = ["--ssh-config", b.ssh_config]
    inv = b.inventory("startup", 1, 1, b.port())
    rank = str(b.rank_script)
    return [
        ("`python -c pass` (the interpreter)", [sys.executable, "-c", "pass"]),
        ("`sshddp --version`", [*b.sshddp, "--version"]),
        ("`sshddp ps` (no runs)", [*b.sshddp, "ps"]),
        (
            "`sshddp launch --dry-run -H h1 rank.py`",
            [*b.sshddp, "launch", "--dry-run", *ssh, "-H", b.aliases(1)[0], rank],
        ),
        (
            "`sshddp launch --dry-run inv.yaml rank.py`",
            [*b.sshddp, "launch", "--dry-run", *ssh, str(inv), rank],
        ),
    ]


def bench_startup(b: Bench, reps: int) -> list[StartRow]:
    """Every command ``reps * RUNS_PER_REP`` times, round robin, so that a slow moment of
    the machine falls on all of them alike."""
    todo = commands(b)
    runs: dict[str, list[Finished]] = {label: [] for label, _ in todo}
    for _ in range(reps * RUNS_PER_REP):
        for label, argv in todo:
            runs[label].append(expect_rc(b.start(argv, stdout_null=True).finish(), 0, label))
    rows = [
        StartRow(label, stat([r.wall for r in done]), stat([r.cpu for r in done]))
        for label, done in runs.items()
    ]
    progress("startup: " + ", ".join(f"{r.wall.median * 1000:.0f} ms" for r in rows))
    return rows


def startup_table(rows: list[StartRow]) -> list[str]:
    floor = rows[0].wall.median
    out = [
        "| command | wall (ms) | over the interpreter (ms) | CPU (ms) |",
        "|---|---|---:|---|",
    ]
    for r in rows:
        over = "" if r is rows[0] else f"+{(r.wall.median - floor) * 1000:.0f}"
        out.append(f"| {r.label} | {r.wall.fmt(1000, 0)} | {over} | {r.cpu.fmt(1000, 0)} |")
    return out


METHOD = """\
* **startup**: commands that reach no host, each a new process from `Popen` to its exit
  (stdout to `/dev/null`), `{runs} x --reps` times each, round robin: `python -c pass` with the
  venv's interpreter, `sshddp --version`, `sshddp ps` with an empty registry, and `sshddp
  launch --dry-run` of the rank program onto one `-H` alias and from a one-host YAML
  inventory (`--ssh-config cfg`: paramiko reads it to resolve the alias). CPU is user+sys.
"""

CASE: Case[list[StartRow]] = Case(
    name="startup",
    hosts=lambda sizes: 1,
    run=lambda b, sizes, reps: bench_startup(b, reps),
    title=lambda rows: "Start-up of the command line (before any host is reached)",
    table=startup_table,
    noisy=lambda rows: [f"startup/{r.label}" for r in rows if r.wall.noisy],
    method=lambda sizes: METHOD.format(runs=RUNS_PER_REP),
)
