"""The benchmarks' paired statistic (``scripts/sshddp_bench/harness.py``): the interval for a
median that the launch and Slurm cases judge their targets by; and the rendezvous ports
the suite hands its runs."""

from __future__ import annotations

import collections
import itertools
import math
import random
import socket
from pathlib import Path
from typing import cast

import pytest

from sshddp_bench.floor import FloorRow, floor_table
from sshddp_bench.harness import (
    PORTS,
    Bench,
    free,
    interval_cell,
    median_interval,
    order,
    paired,
    stat,
)
from sshddp_lab.sshd import SshdCluster


def test_the_interval_is_the_order_statistics_the_binomial_gives() -> None:
    values = [float(v) for v in range(1, 16)]
    random.Random(3).shuffle(values)
    lo, hi, covered = median_interval(values)
    # n = 15: P(Binomial(15, 1/2) <= 3) = 576/32768, so x(4) and x(12) cover 96.5%
    assert (lo, hi) == (4.0, 12.0)
    assert covered == pytest.approx(1 - 2 * 576 / 32768)
    lo, hi, covered = median_interval([float(v) for v in range(1, 10)])
    assert (lo, hi, round(covered, 4)) == (2.0, 8.0, 0.9609)


def test_too_few_values_give_the_whole_range_and_say_how_sure_it_is() -> None:
    assert median_interval([5.0, 1.0, 3.0, 2.0, 4.0]) == (1.0, 5.0, 1 - 2 / 32)
    lo, hi, covered = median_interval([])
    assert math.isnan(lo) and math.isnan(hi) and covered == 0.0


def test_paired_differences_take_each_repetition_with_its_partner() -> None:
    diffs = paired([2.0, 3.0, 2.5], [1.5, 2.0, 2.6])
    assert diffs.values == pytest.approx((0.5, 1.0, -0.1))
    with pytest.raises(ValueError):
        paired([1.0, 2.0], [1.0])


def test_a_target_is_met_only_when_the_whole_interval_is_within_it() -> None:
    inside = stat([0.1, 0.2, 0.3, 0.35, 0.4, 0.2, 0.3, 0.25, 0.45])
    assert interval_cell(inside, 0.5) == "+0.30 [+0.20, +0.40] 96%: met"
    # the median (0.40) is within 0.5 s, but the interval's upper end (x(8) = 0.60) is not
    reaching = stat([0.1, 0.2, 0.3, 0.35, 0.4, 0.45, 0.55, 0.6, 0.7])
    cell = interval_cell(reaching, 0.5)
    assert cell == "+0.40 [+0.20, +0.60] 96%: **missed**: reaches +0.10 s past it", cell
    beyond = stat([0.3, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.8])
    cell = interval_cell(beyond, 0.5)
    assert cell == "+0.55 [+0.40, +0.70] 96%: **missed**: reaches +0.20 s past it", cell


def test_rendezvous_ports_lie_below_the_ephemeral_range_and_skip_a_taken_neighbour(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An outgoing connection's local port comes from ip_local_port_range: a rendezvous
    # port there can lose P + 1 to one between the pick and the run's preflight.
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    bench = Bench(tmp_path, cast(SshdCluster, None), {}, [], tmp_path / "rank.py")
    pairs = [p for p in range(PORTS.start, PORTS.stop, 2) if free(p) and free(p + 1)]
    taken, ok1, ok2 = pairs[0], pairs[1], pairs[2]
    with socket.socket() as neighbour:
        neighbour.bind(("", taken + 1))
        neighbour.listen()
        # the first draw's P + 1 is taken, the third repeats a port already handed out
        draws = iter([taken, ok1, ok1, ok2])
        monkeypatch.setattr(random, "randrange", lambda *_: next(draws))
        got = [bench.port(), bench.port()]
    assert got == [ok1, ok2]
    assert all(PORTS.start <= p and p + 1 < min(PORTS.stop, ephemeral) for p in got)


def test_the_floor_case_says_when_two_identical_launches_differ_more_than_the_target() -> None:
    # pdsh against itself: spread ±1 s (a busy 2-core box at 16 hosts) and ±0.05 s
    ours = [12.0 + 0.1 * (i % 3) for i in range(9)]
    pdsh = [12.0] * 9
    wide = [12.0 + (1.0 if i % 2 else -1.0) for i in range(9)]
    narrow = [12.0 + (0.05 if i % 2 else -0.05) for i in range(9)]
    said = "\n".join(floor_table(FloorRow(16, stat(ours), stat(pdsh), stat(wide))))
    assert (
        "resolves 0.2 s at 16 hosts (the interval of two identical launches within ±0.2 s)" in said
    )
    assert "**missed**: reaches ±1.00 s, wider than ±0.2 s" in said
    assert "median within +0.2 s: yes (+0.10; sooner in 0 of 9)" in said
    said = "\n".join(floor_table(FloorRow(16, stat(ours), stat(pdsh), stat(narrow))))
    assert "within ±0.2 s): met." in said


@pytest.mark.parametrize("methods", [("sshddp", "pdsh"), ("sshddp", "pdsh", "ssh")])
def test_every_two_repetitions_run_each_pair_of_methods_once_each_way_round(
    methods: tuple[str, ...],
) -> None:
    # A plain rotation of three runs sshddp before pdsh in two repetitions of three: on a
    # machine that slows from one run to the next, the paired difference leans its way.
    runs = [order(methods, rep) for rep in range(6 * len(methods))]
    assert all(sorted(run) == sorted(methods) for run in runs)
    for rep in range(0, len(runs), 2):
        for a, b in itertools.combinations(methods, 2):
            firsts = [run.index(a) < run.index(b) for run in runs[rep : rep + 2]]
            assert sorted(firsts) == [False, True], (rep, a, b, runs[rep : rep + 2])
    firsts = collections.Counter(run[0] for run in runs)
    assert set(firsts.values()) == {len(runs) // len(methods)}
