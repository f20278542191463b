"""Case ``stacks``: ``sshddp stacks`` of a running run, end to end, from a fresh command.

A detached run of ``--stacks-hosts`` hosts (8 by default) × 2 sleeping ranks; once every
rank is up, ``sshddp stacks`` runs from a new process, as from another terminal: its time
covers the interpreter's start, reaching every host, every process's dump, grouping,
saving the dumps and printing. The same with ``--native`` (py-spy beside the hosts'
interpreter, as the test extras install it). Nothing else reads stacks; ``sshddp ps``,
one short call per host, is the floor of any command that asks every host.
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
    order,
    progress,
    stat,
    verdict,
    wait_logs,
)

ST_NPROC = 2
TARGET_S = 1.5  # the target for 16 ranks on 8 hosts


COMMANDS = ("plain", "native", "ps")


@dataclass(frozen=True)
class StacksRow:
    hosts: int
    plain: Stat  #: seconds, `sshddp stacks RUN`
    native: Stat  #: seconds, `sshddp stacks --native RUN`
    ps: Stat  #: seconds, `sshddp ps`: one status call per host, the floor of any command
    cpu: Stat  #: `sshddp stacks`'s own CPU (user + sys, with what it reaped)


def hosts(n: int) -> str:
    return f"{n} host" if n == 1 else f"{n} hosts"


def command_argv(b: Bench, name: str, how: str) -> list[str]:
    if how == "ps":
        return [*b.sshddp, "ps", "--ssh-config", b.ssh_config]
    native = ["--native"] if how == "native" else []
    return [*b.sshddp, "stacks", *native, "--ssh-config", b.ssh_config, name]


def command_once(b: Bench, name: str, n: int, how: str) -> tuple[float, float]:
    """(seconds, CPU seconds) of one command; `stacks` is checked to have read every rank."""
    done = expect_rc(b.start(command_argv(b, name, how), stdout_null=True).finish(), 0, how)
    want = f"{n * ST_NPROC} ranks on {hosts(n)} in 1 group"
    if how != "ps" and want not in done.stderr:
        raise BenchError(f"sshddp stacks: expected “{want}” on stderr, got:\n{done.stderr}")
    return done.wall, done.cpu


def bench_stacks(b: Bench, n: int, reps: int) -> StacksRow:
    port, name = b.port(), b.name("stacks")
    inv = b.inventory(name, n, ST_NPROC, port)
    argv = b.launch_argv(name, port, inv, "sleep", options=["--detach"])
    expect_rc(b.start(argv).finish(), 0, "sshddp launch --detach (stacks)")
    wall: dict[str, list[float]] = {how: [] for how in COMMANDS}
    cpu: list[float] = []
    try:
        wait_logs(b, name, n, "READY", n * ST_NPROC, timeout=240.0)
        for rep in range(reps):
            for how in order(COMMANDS, rep):
                seconds, used = command_once(b, name, n, how)
                wall[how].append(seconds)
                if how == "plain":
                    cpu.append(used)
    finally:
        poller = GonePoller("SSHDDP_RUN_ID", name)
        stop = [*b.sshddp, "stop", "--ssh-config", b.ssh_config, name]
        expect_rc(b.start(stop).finish(), 0, "sshddp stop (stacks)")
        poller.start()
        poller.join(30.0)
    row = StacksRow(n, stat(wall["plain"]), stat(wall["native"]), stat(wall["ps"]), stat(cpu))
    progress(
        f"stacks {n} hosts: {row.plain.fmt()} s, --native {row.native.fmt()} s, ps {row.ps.fmt()} s"
    )
    return row


def stacks_table(r: StacksRow) -> list[str]:
    ranks = r.hosts * ST_NPROC
    target = (
        verdict(r.plain.median <= TARGET_S, f"{r.plain.median - TARGET_S:.2f} s over")
        if ranks >= 16
        else f"not measured ({ranks} ranks on {hosts(r.hosts)} only)"
    )
    over = r.plain.median - r.ps.median
    return [
        f"A detached run of {hosts(r.hosts)} × {ST_NPROC} sleeping ranks ({ranks} ranks and "
        f"{r.hosts} torchrun, every one read). Seconds from starting the command to "
        "its exit, the three commands in turn:",
        "",
        "| command | end to end (s) | target ≤ 1.5 s at 16 ranks on 8 hosts |",
        "|---|---|---|",
        f"| `sshddp stacks RUN` | {r.plain.fmt()} | {target} |",
        f"| `sshddp stacks --native RUN` (py-spy) | {r.native.fmt()} | no target |",
        f"| `sshddp ps` (one status call per host) | {r.ps.fmt()} | the floor |",
        "",
        f"`stacks` takes {over:+.2f} s over `ps`, which reaches the same hosts with one short "
        f"call each; its own CPU is {r.cpu.fmt()} s. Every host's sshd session and Python "
        "share this machine's cores, so on this box the per-host cost adds up where on a "
        "cluster each host pays its own in parallel.",
    ]


def stacks_noisy(r: StacksRow) -> list[str]:
    return [f"stacks/{how}" for how in COMMANDS if getattr(r, how).noisy]


METHOD = """\
* **stacks**: a detached run of {hosts} hosts × {nproc} ranks of the rank program's `sleep`
  mode (no torch in the ranks; torchrun imports it). Once every READY is in the nodes'
  `node.log`, `sshddp stacks RUN`, `sshddp stacks --native RUN` (py-spy 0.4.3 beside the
  hosts' interpreter) and `sshddp ps` run as new processes in turn, {reps} times each, in
  a rotation and then that rotation reversed. `stacks` must report every rank in one
  group. Time is the command's wall clock, from its start to its exit; `stacks` writes its
  dumps under the run's log directory each time.
"""


def method(sizes: Sizes) -> str:
    return METHOD.format(hosts=sizes.stacks, nproc=ST_NPROC, reps="`--reps`")


CASE: Case[StacksRow] = Case(
    name="stacks",
    hosts=lambda sizes: sizes.stacks,
    run=lambda b, sizes, reps: bench_stacks(b, sizes.stacks, reps),
    title=lambda row: (
        f"Stacks of a running run ({row.hosts * ST_NPROC} ranks on {hosts(row.hosts)})"
    ),
    table=stacks_table,
    noisy=stacks_noisy,
    method=method,
)
