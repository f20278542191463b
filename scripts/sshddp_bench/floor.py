"""Case ``floor``: how small a launch difference this machine can resolve at the largest
launch size. sshddp, pdsh and pdsh again run back to back (``harness.order``): the paired
sshddp - pdsh difference is the launch case's, and pdsh - pdsh (the same command twice, an
A/A comparison) is what the machine alone puts between two identical launches. When the
A/A interval is wider than the launch target, no interval of that many repetitions can
show the target met, whatever sshddp does; the medians still say which side it is on."""

from __future__ import annotations

from dataclasses import dataclass

from sshddp_bench.case import Case, Sizes
from sshddp_bench.harness import (
    PAIRED,
    Bench,
    Stat,
    interval_cell,
    median_interval,
    order,
    paired,
    progress,
    stat,
    verdict,
)
from sshddp_bench.launch import TARGET_S, launch_once

ORDER = ("sshddp", "pdsh", "pdsh2")


@dataclass(frozen=True)
class FloorRow:
    hosts: int
    sshddp: Stat
    pdsh: Stat
    pdsh2: Stat

    @property
    def diff(self) -> Stat:
        """sshddp - pdsh, each repetition."""
        return paired(self.sshddp.values, self.pdsh.values)

    @property
    def same(self) -> Stat:
        """pdsh - pdsh: two identical launches of each repetition (which of the two runs
        first changes as the whole order does)."""
        return paired(self.pdsh2.values, self.pdsh.values)


def bench_floor(b: Bench, n: int, reps: int) -> FloorRow:
    got: dict[str, list[float]] = {how: [] for how in ORDER}
    for rep in range(reps):
        for how in order(ORDER, rep):
            seconds, _ = launch_once(b, "pdsh" if how == "pdsh2" else how, n)
            got[how].append(seconds)
    row = FloorRow(n, stat(got["sshddp"]), stat(got["pdsh"]), stat(got["pdsh2"]))
    progress(
        f"floor {n} hosts: sshddp − pdsh {row.diff.median:+.2f}, pdsh − pdsh {row.same.median:+.2f}"
    )
    return row


def floor_table(r: FloorRow) -> list[str]:
    lo, hi, covered = median_interval(r.same.values)
    half = max(-lo, hi)
    resolvable = verdict(half <= TARGET_S, f"reaches ±{half:.2f} s, wider than ±{TARGET_S} s")
    within = r.diff.median <= TARGET_S
    return [
        f"{r.hosts} hosts, {len(r.diff.values)} repetitions of sshddp, pdsh and pdsh a second "
        "time, back to back, every two repetitions each pair once each way round.",
        "",
        "| hosts | sshddp (s) | pdsh (s) | pdsh, second copy (s) | sshddp − pdsh, paired "
        f"(target ≤ +{TARGET_S} s) | pdsh − pdsh, paired (A/A) |",
        "|---:|---|---|---|---|---|",
        f"| {r.hosts} | {r.sshddp.fmt()} | {r.pdsh.fmt()} | {r.pdsh2.fmt()} "
        f"| {interval_cell(r.diff, TARGET_S)} "
        f"| {r.same.median:+.2f} [{lo:+.2f}, {hi:+.2f}] {covered:.0%} |",
        "",
        PAIRED,
        "",
        f"This machine resolves {TARGET_S} s at {r.hosts} hosts (the interval of two "
        f"identical launches within ±{TARGET_S} s): {resolvable}. sshddp − pdsh median "
        f"within +{TARGET_S} s: "
        f"{'yes' if within else 'no'} ({r.diff.median:+.2f}; sooner in "
        f"{sum(d < 0 for d in r.diff.values)} of {len(r.diff.values)}).",
    ]


def method(sizes: Sizes) -> str:
    return (
        f"* **floor**: the launch case's measurement at {max(sizes.launch)} hosts, with pdsh "
        "run a second time in each repetition (sshddp, pdsh, pdsh; a rotation, then that "
        "rotation reversed): "
        "the pdsh − pdsh interval is how wide two identical launches' interval is on this "
        "machine, the smallest difference its repetitions can resolve.\n"
    )


CASE: Case[FloorRow] = Case(
    name="floor",
    hosts=lambda sizes: max(sizes.launch),
    run=lambda b, sizes, reps: bench_floor(b, max(sizes.launch), reps),
    title=lambda r: f"Launch: what this machine can resolve at {r.hosts} hosts (A/A)",
    table=floor_table,
    noisy=lambda r: [f"floor/{r.hosts}"] if r.sshddp.noisy or r.pdsh.noisy else [],
    method=method,
)
