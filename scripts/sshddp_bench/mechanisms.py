"""What each speed mechanism buys: launch and restart latency with and without it.

Each variant is a copy of this checkout's ``src/sshddp`` with one mechanism taken out by a
textual patch (an anchor that must occur exactly once), run as ``python -m sshddp`` with
the copy first on ``PYTHONPATH``; the product has no switch for any of them. Two copies
of the unpatched tree (``baseline`` and ``baseline2``) give the noise floor: an effect
smaller than the difference between two identical trees is below it. The variants run
interleaved (every repetition runs each once, in a rotated order), after one untimed launch
each (their bytecode compiled).

    cd scripts && python -m sshddp_bench.mechanisms --hosts 8 --reps 5

With ``--cases slurm`` the launch runs over srun instead (``--hosts`` nodes x 1 rank), into
one allocation of the test lab's Slurm cluster (``sshddp_bench.slurm``; needs root), as the
slurm case's ``sshddp launch --transport srun slurm`` does, every variant into the same job.

    cd scripts && python -m sshddp_bench.mechanisms --cases slurm --hosts 3 --reps 11

The result is stored as ``benchmarks/results/mechanisms.json`` (``mechanisms-slurm.json``
over srun; ``--results``, ``--no-store``) and BENCHMARKS.md renders it (``section``): each
variant's medians, its Δ against ``baseline``, whether that Δ is above the noise floor, and
the project's verdict (``ABOUT``: a decision, not a measurement).
A mechanism removed from the product leaves ``VARIANTS`` with it (its anchors no longer
occur: asking for it fails before anything runs).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shlex
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sshddp_bench import slurm
from sshddp_bench.harness import (
    Bench,
    BenchError,
    expect_rc,
    progress,
    reap_leftovers,
    run_dir,
    running_bench,
)
from sshddp_bench.launch import launch_once
from sshddp_bench.machine import load_average, machine
from sshddp_bench.restart import restart_gap
from sshddp_bench.store import RESULTS, Stored, save

SRC = Path(__file__).resolve().parents[2] / "src"


@dataclass(frozen=True)
class Patch:
    """Replace ``old`` (exactly one occurrence) with ``new`` in ``path`` (under sshddp/)."""

    path: str
    old: str
    new: str


#: mechanism -> the patches that take it out ("" : none, a baseline)
VARIANTS: dict[str, tuple[Patch, ...]] = {
    "baseline": (),
    "baseline2": (),
    "standby": (
        Patch(
            "remote/node/standby.py",
            "self.standby = Standby.start(self.argv, ahead, self.cwd, attempt)",
            "pass",
        ),
    ),
    "os._exit": (
        Patch("remote/rankside/agent.py", "    os._exit(code)\n", "    sys.exit(code)\n"),
    ),
    "store-poll": (
        Patch("remote/rankside/agent.py", "store = store_endpoint(sys.argv[1:])", "store = None"),
    ),
}


#: variant -> (the mechanism it takes out, its lines, the verdict taken on it)
ABOUT: dict[str, tuple[str, str, str]] = {
    "baseline": ("nothing taken out", "—", "—"),
    "baseline2": ("nothing taken out (the noise floor)", "—", "—"),
    "standby": (
        "the standby torchrun, handed the node's output over a Unix socket "
        "(`remote/node/standby.py`, `Spare`)",
        "~240",
        "**keep**",
    ),
    "os._exit": (
        "the agent shim's `os._exit` (`remote/rankside/agent.py`, `finish`)",
        "~50",
        "**keep**",
    ),
    "store-poll": (
        "polling node 0's store (`remote/rankside/agent.py`, `await_store`)",
        "~80",
        "kept: halves a restart, 0.05 s under the bar (docs/design.md)",
    ),
}
NAME = "mechanisms"  #: its stored result's name
SLURM_NAME = "mechanisms-slurm"  #: its stored result's name over srun (``--cases slurm``)
SRUN = "srun"  #: ``MechanismsRow.transport`` of a result measured over srun
FLOOR_MIN = 0.005  #: a noise floor smaller than this shows as 0.00 s: no ratio to it


@dataclass(frozen=True)
class Spread:
    """Median (min–max) of one variant's samples of one case, seconds."""

    median: float
    lo: float
    hi: float


@dataclass(frozen=True)
class Variant:
    """One variant's result: what it takes out and what that changed."""

    name: str  #: its ``--only`` name (the mechanism taken out)
    what: str  #: the mechanism, in words
    lines: str  #: about how many lines it is
    launch: Spread | None  #: None: not measured
    restart: Spread | None
    verdict: str  #: the decision taken on it (``ABOUT``), not measured


@dataclass(frozen=True)
class MechanismsRow:
    hosts: int
    variants: tuple[Variant, ...]  #: ``baseline`` and ``baseline2`` among them
    source: str  #: where the numbers come from, when not from this tool's own run
    transport: str = "ssh"  #: how the launches reached the hosts: ``ssh``, or ``SRUN``


def make_tree(root: Path, variant: str) -> Path:
    """``src/sshddp`` copied under ``root/variant`` with ``variant``'s patches applied."""
    dest = root / variant
    shutil.copytree(SRC / "sshddp", dest / "sshddp", ignore=shutil.ignore_patterns("__pycache__"))
    for patch in VARIANTS[variant]:
        path = dest / "sshddp" / patch.path
        text = path.read_text()
        if text.count(patch.old) != 1:
            raise BenchError(f"{variant}: {patch.path} has {patch.old!r} {text.count(patch.old)}x")
        path.write_text(text.replace(patch.old, patch.new))
    return dest


def bench_for(b: Bench, tree: Path) -> Bench:
    """``b`` running the copy at ``tree`` (same cluster, ports and names)."""
    env = {**b.env, "PYTHONPATH": str(tree)}
    return dataclasses.replace(b, env=env, sshddp=[sys.executable, "-m", "sshddp"])


def restart_once(b: Bench, hosts: int) -> float:
    """Seconds from the failing rank's FAIL to every rank's AGAIN, ``hosts`` x 1 rank."""
    port, name = b.port(), b.name("mrestart")
    inv = b.inventory(name, hosts, 1, port)
    argv = b.launch_argv(name, port, inv, "restart", options=["--max-restarts", "1"])
    expect_rc(b.start(argv, stdout_null=True).finish(), 0, "sshddp launch --max-restarts 1")
    logs = [(run_dir(b, name, n) / "node.log").read_text(errors="replace") for n in range(hosts)]
    return restart_gap("\n".join(logs), hosts)


def sample(b: Bench, hosts: int, cases: Sequence[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    if "launch" in cases:
        out["launch"] = launch_once(b, "sshddp", hosts)[0]
    if "restart" in cases:
        out["restart"] = restart_once(b, hosts)
    return out


def spread(values: Sequence[float]) -> Spread | None:
    return Spread(statistics.median(values), min(values), max(values)) if values else None


def row_of(
    hosts: int, results: dict[str, list[dict[str, float]]], transport: str = "ssh"
) -> MechanismsRow:
    variants = []
    for name, samples in results.items():
        what, lines, verdict = ABOUT.get(name, (name, "?", "?"))
        launch = spread([s["launch"] for s in samples if "launch" in s])
        restart = spread([s["restart"] for s in samples if "restart" in s])
        variants.append(Variant(name, what, lines, launch, restart, verdict))
    return MechanismsRow(hosts, tuple(variants), "", transport)


def delta(got: Spread | None, base: Spread | None) -> float | None:
    return None if got is None or base is None else got.median - base.median


def noise_floor(row: MechanismsRow) -> tuple[float | None, float | None]:
    """``baseline2`` − ``baseline``, launch and restart: the same tree twice."""
    by = {v.name: v for v in row.variants}
    base, twin = by.get("baseline"), by.get("baseline2")
    if base is None or twin is None:
        return None, None
    return delta(twin.launch, base.launch), delta(twin.restart, base.restart)


def against_floor(row: MechanismsRow, v: Variant) -> str:
    """Each case's Δ as a multiple of the noise floor's size: near 1x or below, noise."""
    if v.name.startswith("baseline"):
        return "—"
    base = next((b for b in row.variants if b.name == "baseline"), None)
    got = []
    for case, floor in zip(("launch", "restart"), noise_floor(row)):
        d = delta(getattr(v, case), getattr(base, case) if base else None)
        if d is None or floor is None or abs(floor) < FLOOR_MIN:
            got.append(f"{case} n/a")
        else:
            got.append(f"{case} {d / abs(floor):+.1f}x")
    return ", ".join(got)


def fmt(value: Spread | float | None) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, Spread):
        return f"{value.median:.2f} ({value.lo:.2f}–{value.hi:.2f})"
    return f"{value:+.2f}"


def table(row: MechanismsRow) -> list[str]:
    base = next((v for v in row.variants if v.name == "baseline"), None)
    out = [
        "| without | mechanism | lines | launch, s: median (min–max) | launch Δ "
        "| restart, s: median (min–max) | restart Δ | Δ / noise floor | verdict |",
        "|---|---|---:|---|---:|---|---:|---|---|",
    ]
    for v in row.variants:
        launch_d = delta(v.launch, base.launch if base else None)
        restart_d = delta(v.restart, base.restart if base else None)
        cells = [f"`{v.name}`", v.what, v.lines, fmt(v.launch), fmt(launch_d)]
        cells += [fmt(v.restart), fmt(restart_d), against_floor(row, v), v.verdict]
        out.append(f"| {' | '.join(cells)} |")
    launch_f, restart_f = noise_floor(row)
    floor = f"launch {fmt(launch_f)} s, restart {fmt(restart_f)} s"
    return [*out, "", f"Noise floor (`baseline2` − `baseline`, the same tree twice): {floor}."]


def title(row: MechanismsRow) -> str:
    if row.transport == SRUN:
        return f"## What each mechanism buys over srun: launch, {row.hosts} nodes x 1 rank"
    return f"## What each mechanism buys: launch and restart, {row.hosts} hosts"


def section(stored: Stored) -> list[str]:
    """BENCHMARKS.md's section of the stored result: when and where, the table, the command."""
    row: MechanismsRow = stored.row
    facts = "; ".join(f"{k}: {v}" for k, v in stored.machine)
    lines = [
        title(row),
        "",
        f"*Measured* ({stored.reps} repetition(s)): {facts}.",
    ]
    if row.source:
        lines += ["", f"*Source:* {row.source}"]
    lines += ["", *table(row), "", f"Reproduce: `{stored.command}`", "", "Method:", ""]
    paragraphs = (__doc__ or "").split("\n\n")
    said = [paragraphs[1], paragraphs[3]] if row.transport == SRUN else [paragraphs[1]]
    return [*lines, *(" ".join(said).replace("\n", " ").replace("``", "`"),)]


def measure(
    variants: Sequence[str], hosts: int, reps: int, cases: Sequence[str], log: Path
) -> dict[str, list[dict[str, float]]]:
    """Every variant's samples, by variant: ``reps`` interleaved repetitions each."""
    results: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="sshddp-mech-") as tmp, running_bench(hosts) as b:
        benches = {v: bench_for(b, make_tree(Path(tmp), v)) for v in variants}
        for v in variants:  # untimed: their bytecode compiled
            launch_once(benches[v], "sshddp", hosts)
        for rep in range(reps):
            turn = list(variants[rep % len(variants) :]) + list(variants[: rep % len(variants)])
            for v in turn:
                got = sample(benches[v], hosts, cases)
                results[v].append(got)
                with log.open("a") as fh:
                    fh.write(json.dumps({"variant": v, "rep": rep, **got}) + "\n")
                progress(f"rep {rep} {v}: {got}")
        reap_leftovers()
    return results


def measure_slurm(
    variants: Sequence[str], nodes: int, reps: int, log: Path
) -> dict[str, list[dict[str, float]]]:
    """Every variant's launches over srun into one ``nodes``-node allocation, by variant:
    ``reps`` interleaved repetitions each, start to every rank's READY line (``launch``)."""
    # running_bench: its rank script, ports and names; its one sshd is not used
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sshddp-mech-")))
        b = stack.enter_context(running_bench(1))
        alloc = stack.enter_context(slurm.allocation(b, nodes))
        runs = {v: on_tree(b, alloc, make_tree(tmp, v)) for v in variants}
        return interleaved(runs, reps, log)


def interleaved(
    runs: dict[str, tuple[Bench, slurm.Allocation]], reps: int, log: Path
) -> dict[str, list[dict[str, float]]]:
    variants = list(runs)
    results: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for v in variants:  # untimed: their bytecode compiled
        slurm.launch_once(*runs[v], "sshddp")
    for rep in range(reps):
        for v in variants[rep % len(variants) :] + variants[: rep % len(variants)]:
            got = {"launch": slurm.launch_once(*runs[v], "sshddp").ready}
            results[v].append(got)
            with log.open("a") as fh:
                fh.write(json.dumps({"variant": v, "rep": rep, "srun": True, **got}) + "\n")
            progress(f"rep {rep} {v}: {got}")
    return results


def on_tree(b: Bench, alloc: slurm.Allocation, tree: Path) -> tuple[Bench, slurm.Allocation]:
    """``b`` and a shell inside ``alloc`` running the copy at ``tree``."""
    env = {**alloc.env, "PYTHONPATH": str(tree)}
    return bench_for(b, tree), dataclasses.replace(alloc, env=env)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", default=",".join(VARIANTS), help="variants, comma-separated")
    parser.add_argument(
        "--cases", default="launch,restart", help="launch,restart over SSH; or slurm (launch)"
    )
    parser.add_argument("--log", default="mechanisms.jsonl", help="every sample, appended")
    parser.add_argument("--results", default=str(RESULTS), help="where the result is stored")
    parser.add_argument("--no-store", action="store_true", help="store no result")
    args = parser.parse_args(argv)
    variants = [v for v in args.only.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    cases = [c for c in args.cases.split(",") if c]
    over_srun = cases == ["slurm"]
    info = machine()
    if over_srun:
        results = measure_slurm(variants, args.hosts, args.reps, Path(args.log))
        hosts = f"{args.hosts} Slurm nodes (the lab's cluster), over srun"
    else:
        results = measure(variants, args.hosts, args.reps, cases, Path(args.log))
        hosts = f"{args.hosts} sshd on loopback"
    info += [("hosts", hosts), ("load average at end", load_average())]
    row = row_of(args.hosts, results, SRUN if over_srun else "ssh")
    print("\n".join(table(row)))
    if not args.no_store:
        given = list(sys.argv[1:] if argv is None else argv)
        cmd = shlex.join(["python", "-m", "sshddp_bench.mechanisms", *given])
        name = SLURM_NAME if over_srun else NAME
        stored = Stored(name, row, tuple(info), f"cd scripts && {cmd}", args.reps, None)
        progress(f"stored {save(Path(args.results), stored)}")


if __name__ == "__main__":
    main()
