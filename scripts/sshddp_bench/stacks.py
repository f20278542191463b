"""Case ``stacks``: ``sshddp stacks`` of a running run, end to end, from a fresh command.

A detached run of ``--stacks-hosts`` hosts (8 by default) × 2 sleeping ranks; once every
rank is up, ``sshddp stacks`` runs from a new process, as from another terminal: its time
covers the interpreter's start, reaching every host, every process's dump, grouping,
saving the dumps and printing. The same with ``--native`` (py-spy beside the hosts'
interpreter, as the test extras install it). No baseline: nothing else does this.
"""

from __future__ import annotations

from dataclasses import dataclass

from sshddp_bench.case import Case, Sizes
from sshddp_bench.harness import (
    Bench,
    BenchError,
    GonePoller,
    Stat,
    expect_rc,
    progress,
    stat,
    verdict,
    wait_logs,
)

ST_NPROC = 2
TARGET_S = 1.5  # the target for 16 ranks on 8 hosts


@dataclass(frozen=True)
class StacksRow:
    hosts: int
    plain: Stat  #: seconds, `sshddp stacks RUN`
    native: Stat  #: seconds, `sshddp stacks --native RUN`
    cpu: Stat  #: the command's own CPU (user + sys, with what it reaped), plain


def stacks_argv(b: Bench, name: str, *options: str) -> list[str]:
    return [*b.sshddp, "stacks", *options, "--ssh-config", b.ssh_config, name]


def stacks_once(b: Bench, name: str, n: int, native: bool) -> tuple[float, float]:
    """(seconds, CPU seconds) of one `sshddp stacks`, checked to have read every rank."""
    argv = stacks_argv(b, name, *(["--native"] if native else []))
    done = expect_rc(b.start(argv, stdout_null=True).finish(), 0, "sshddp stacks")
    want = f"{n * ST_NPROC} ranks on {n} hosts in 1 group"
    if want not in done.stderr:
        raise BenchError(f"sshddp stacks: expected “{want}” on stderr, got:\n{done.stderr}")
    return done.wall, done.cpu


def bench_stacks(b: Bench, n: int, reps: int) -> StacksRow:
    port, name = b.port(), b.name("stacks")
    inv = b.inventory(name, n, ST_NPROC, port)
    argv = b.launch_argv(name, port, inv, "sleep", options=["--detach"])
    expect_rc(b.start(argv).finish(), 0, "sshddp launch --detach (stacks)")
    try:
        wait_logs(b, name, n, "READY", n * ST_NPROC, timeout=240.0)
        plain: list[float] = []
        native: list[float] = []
        cpu: list[float] = []
        for rep in range(reps):
            for how in (False, True) if rep % 2 == 0 else (True, False):
                wall, used = stacks_once(b, name, n, how)
                (native if how else plain).append(wall)
                if not how:
                    cpu.append(used)
    finally:
        poller = GonePoller("SSHDDP_RUN_ID", name)
        stop = [*b.sshddp, "stop", "--ssh-config", b.ssh_config, name]
        expect_rc(b.start(stop).finish(), 0, "sshddp stop (stacks)")
        poller.start()
        poller.join(30.0)
    row = StacksRow(n, stat(plain), stat(native), stat(cpu))
    progress(f"stacks {n} hosts: {row.plain.fmt()} s, --native {row.native.fmt()} s")
    return row


def stacks_table(r: StacksRow) -> list[str]:
    ranks = r.hosts * ST_NPROC
    target = (
        verdict(r.plain.median <= TARGET_S, f"{r.plain.median - TARGET_S:.2f} s over")
        if ranks >= 16
        else f"not measured ({ranks} ranks on {r.hosts} hosts only)"
    )
    return [
        f"A detached run of {r.hosts} hosts × {ST_NPROC} sleeping ranks ({ranks} ranks, plus "
        f"{r.hosts} torchrun agents, every one read). Seconds from starting `sshddp stacks` "
        "to its exit:",
        "",
        "| command | end to end (s) | its CPU (s) | target ≤ 1.5 s at 16 ranks on 8 hosts |",
        "|---|---|---|---|",
        f"| `sshddp stacks RUN` | {r.plain.fmt()} | {r.cpu.fmt()} | {target} |",
        f"| `sshddp stacks --native RUN` (py-spy) | {r.native.fmt()} | | no target |",
    ]


def stacks_noisy(r: StacksRow) -> list[str]:
    return [f"stacks/{how}" for how, s in (("plain", r.plain), ("native", r.native)) if s.noisy]


METHOD = """\
* **stacks**: a detached run of {hosts} hosts × {nproc} ranks of the rank program's `sleep`
  mode (no torch in the ranks; torchrun imports it). Once every READY is in the nodes'
  `node.log`, `sshddp stacks RUN` runs as a new process, {reps} times, alternating with
  `--native` (py-spy 0.4.3 beside the hosts' interpreter). Each must report every rank in
  one group. Time is the command's wall clock, from its start to its exit; its dumps are
  written under the run's log directory each time.
"""


def method(sizes: Sizes) -> str:
    return METHOD.format(hosts=sizes.stacks, nproc=ST_NPROC, reps="`--reps`")


CASE: Case[StacksRow] = Case(
    name="stacks",
    hosts=lambda sizes: sizes.stacks,
    run=lambda b, sizes, reps: bench_stacks(b, sizes.stacks, reps),
    title=lambda row: (
        f"Stacks of a running run ({row.hosts * ST_NPROC} ranks on {row.hosts} hosts)"
    ),
    table=stacks_table,
    noisy=stacks_noisy,
    method=method,
)
