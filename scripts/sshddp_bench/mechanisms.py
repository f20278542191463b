"""What each speed mechanism buys: launch and restart latency with and without it.

Each variant is a copy of this checkout's ``src/sshddp`` with one mechanism taken out by a
textual patch (an anchor that must occur exactly once), run as ``python -m sshddp`` with
the copy first on ``PYTHONPATH``; the product has no switch for any of them. Two copies
of the unpatched tree (``baseline`` and ``baseline2``) give the noise floor: an effect
smaller than the difference between two identical trees is below it. The variants run
interleaved (every repetition runs each once, in a rotated order), after one untimed launch
each (their bytecode compiled).

    cd scripts && python -m sshddp_bench.mechanisms --hosts 8 --reps 5

A mechanism removed from the product leaves ``VARIANTS`` with it (its anchors no longer
occur: asking for it fails before anything runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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
from sshddp_bench.restart import restart_gap

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
    "prewarm": (Patch("remote/host_session.py", 'if args.get("warm"):', "if False:"),),
    "standby": (
        Patch(
            "remote/standby.py",
            "self.standby = Standby.start(self.argv, ahead, self.cwd, attempt)",
            "pass",
        ),
    ),
    "os._exit": (Patch("remote/agent.py", "    os._exit(code)\n", "    sys.exit(code)\n"),),
    "store-poll": (
        Patch("remote/agent.py", "store = store_endpoint(sys.argv[1:])", "store = None"),
    ),
}


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


def cell(values: Sequence[float], base: Sequence[float]) -> str:
    if not values:
        return "n/a"
    med = statistics.median(values)
    delta = med - statistics.median(base) if base else float("nan")
    return f"{med:.2f} ({min(values):.2f}–{max(values):.2f}) {delta:+.2f}"


def table(results: dict[str, list[dict[str, float]]], cases: Sequence[str]) -> list[str]:
    base = results.get("baseline", [])
    head = " | ".join(f"{c}: median (min–max) Δ vs baseline, s" for c in cases)
    out = [f"| without | {head} |", "|---|" + "---|" * len(cases)]
    for variant, samples in results.items():
        cells = [cell([s[c] for s in samples], [s[c] for s in base]) for c in cases]
        out.append(f"| {variant} | {' | '.join(cells)} |")
    return out


def run(variants: Sequence[str], hosts: int, reps: int, cases: Sequence[str], log: Path) -> None:
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
    print("\n".join(table(results, cases)))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", default=",".join(VARIANTS), help="variants, comma-separated")
    parser.add_argument("--cases", default="launch,restart")
    parser.add_argument("--log", default="mechanisms.jsonl", help="every sample, appended")
    args = parser.parse_args(argv)
    variants = [v for v in args.only.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    cases = [c for c in args.cases.split(",") if c]
    run(variants, args.hosts, args.reps, cases, Path(args.log))


if __name__ == "__main__":
    main()
