"""Case ``launch``: from starting the command to every rank's first line, against pdsh
and an ``ssh ... &`` loop running the same torchrun commands (``baselines``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sshddp_bench.baselines import baseline_argv, dry_run, node_scripts
from sshddp_bench.case import Case, Sizes
from sshddp_bench.harness import (
    PAIRED,
    Bench,
    BenchError,
    Finished,
    ReadyWatch,
    Stat,
    expect_rc,
    interval_cell,
    order,
    paired,
    progress,
    stat,
    verdict,
)

METHODS = ("sshddp", "pdsh", "ssh")


@dataclass(frozen=True)
class LaunchRow:
    hosts: int
    sshddp: Stat
    pdsh: Stat
    ssh: Stat
    cpu: Stat
    diff: Stat  #: each repetition's sshddp - pdsh, run one after the other (s)


def launch_once(b: Bench, how: str, n: int) -> tuple[float, Finished]:
    """Seconds from the command's start to the last rank's READY line."""
    port, name = b.port(), b.name(f"ll-{how}")
    inv = b.inventory(name, n, 1, port)
    if how == "sshddp":
        argv = b.launch_argv(name, port, inv, "latency")
    else:
        # Planned before the clock starts: the baselines get sshddp's plan for free.
        nodes = dry_run(b, name, port, inv, "latency")
        argv = baseline_argv(b, how, n, node_scripts(b, nodes, name, ""))
    watch = ReadyWatch(n)
    proc = b.start(argv, on_line=watch)
    done = expect_rc(proc.finish(), 0, f"launch via {how} ({n} hosts)")
    if watch.all_at is None:
        raise BenchError(f"{how}: only ranks {sorted(watch.ranks)} of {n} printed READY")
    return watch.all_at - proc.t0, done


def launch_row(b: Bench, n: int, reps: int) -> LaunchRow:
    """``reps`` runs of each method at ``n`` hosts, in ``order``: every two repetitions run
    sshddp before pdsh once and after it once."""
    lat: dict[str, list[float]] = {m: [] for m in METHODS}
    cpu: list[float] = []
    for rep in range(reps):
        for how in order(METHODS, rep):
            seconds, done = launch_once(b, how, n)
            lat[how].append(seconds)
            if how == "sshddp":
                cpu.append(done.cpu)
    diff = paired(lat["sshddp"], lat["pdsh"])
    return LaunchRow(n, stat(lat["sshddp"]), stat(lat["pdsh"]), stat(lat["ssh"]), stat(cpu), diff)


def bench_launch(b: Bench, sizes: Sequence[int], reps: int) -> list[LaunchRow]:
    rows = []
    for n in sizes:
        rows.append(launch_row(b, n, reps))
        progress(f"launch {n} hosts: sshddp {rows[-1].sshddp.fmt()}, pdsh {rows[-1].pdsh.fmt()}")
    return rows


TARGET_S = 0.2  #: sshddp within this of pdsh at every size (issue 16; 0.5 s before)


def launch_line(r: LaunchRow) -> str:
    over = round(r.sshddp.median - r.pdsh.median, 2)
    missed = f"{over - TARGET_S:.2f} s over"
    return (
        f"| {r.hosts} | {r.sshddp.fmt()} | {r.pdsh.fmt()} | {r.ssh.fmt()} "
        f"| {over:+.2f} | {verdict(over <= TARGET_S, missed)} "
        f"| {interval_cell(r.diff, TARGET_S)} | {r.cpu.fmt(1000, 0)} |"
    )


def growth(a: LaunchRow, z: LaunchRow) -> list[str]:
    """How the overhead over pdsh and the coordinator's CPU grow from ``a`` to ``z``."""
    slope = ((z.sshddp.median - z.pdsh.median) - (a.sshddp.median - a.pdsh.median)) / (
        z.hosts - a.hosts
    )
    flat = verdict(abs(slope) <= 0.05, f"{slope * 1000:+.0f} ms per host")
    cpu = (z.cpu.median - a.cpu.median) / (z.hosts - a.hosts)
    return [
        "",
        f"Overhead over pdsh grows by {slope * 1000:+.0f} ms per host "
        f"({a.hosts}→{z.hosts} hosts); flat (≤ 50 ms/host): {flat}. The coordinator's "
        f"own CPU grows by {cpu * 1000:.0f} ms per host; every host's remote processes "
        "(its sshd session, the launch session's interpreter and the supervisor it "
        "forks, torchrun) "
        "share this machine's cores, so on this "
        "box their per-host cost adds up where on a cluster it would run in parallel.",
    ]


def launch_table(rows: Sequence[LaunchRow]) -> list[str]:
    out = [
        "| hosts | sshddp launch (s) | pdsh (s) | `ssh &` loop (s) | sshddp − pdsh (s) "
        f"| target ≤ +{TARGET_S} s | paired: median [interval, ≥ 95%] | sshddp CPU (ms) |",
        "|---:|---|---|---|---:|---|---|---|",
    ]
    out += [launch_line(r) for r in rows]
    out += ["", PAIRED]
    if len(rows) >= 2:
        out += growth(rows[0], rows[-1])
    return out


def launch_noisy(rows: Sequence[LaunchRow]) -> list[str]:
    return [f"launch/{r.hosts}" for r in rows if r.sshddp.noisy or r.pdsh.noisy or r.ssh.noisy]


METHOD = """\
* **launch**: a rank prints `READY <rank>` at import, sleeps 1 s and exits 0; 1 process per
  host; {launch_sizes} hosts. Latency is from starting the command to the last rank's READY
  line on its stdout. sshddp's includes preflight, code copy and supervisor start. pdsh
  (`-R exec ... sh node-%h.sh`) and the `for h ...; do ssh -F cfg $h sh node-$h.sh & done;
  wait` loop run the torchrun commands and environment printed by `sshddp launch
  --dry-run`, with the script already in place on the hosts. sshddp runs with its modules'
  bytecode compiled first, as `pip install` leaves them (the suite compiles them at start).
"""


def method(sizes: Sizes) -> str:
    return METHOD.format(launch_sizes=", ".join(map(str, sizes.launch)))


CASE: Case[list[LaunchRow]] = Case(
    name="launch",
    hosts=lambda sizes: max(sizes.launch),
    run=lambda b, sizes, reps: bench_launch(b, sizes.launch, reps),
    title=lambda rows: "Launch latency (start → every rank's first line)",
    table=launch_table,
    noisy=launch_noisy,
    method=method,
)
