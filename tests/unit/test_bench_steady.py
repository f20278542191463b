"""The pure parts of the ``steps`` and ``relay`` benchmarks (scripts/sshddp_bench/steady.py):
the paired ratio's verdict, /proc/<pid>/stat's CPU fields, % of a core, the STEPS line."""

from __future__ import annotations

import os

import pytest

from sshddp_bench.harness import BenchError, stat
from sshddp_bench.steady import (
    RelayRow,
    StepsRow,
    core_percent,
    cpu_ticks,
    ratio_cell,
    relay_table,
    steps_rate,
    steps_table,
)

# /proc/<pid>/stat of a process whose name holds a space and a ")": utime 1234, stime 56
STAT = (
    "4242 (python3 (x) y) S 1 4242 4242 0 -1 4194560 9350 0 0 0 1234 56 7 8 20 0 3 0 "
    "12345 123456789 4567 18446744073709551615 1 1 0 0 0 0 0 16781312 16386 0 0 0 17 1 0 0"
)


def test_cpu_ticks_are_utime_plus_stime_counted_from_the_last_parenthesis() -> None:
    assert cpu_ticks(STAT) == 1234 + 56


def test_cpu_ticks_read_this_process_own_stat() -> None:
    with open(f"/proc/{os.getpid()}/stat") as fh:
        ticks = cpu_ticks(fh.read())
    times = os.times()
    hz = os.sysconf("SC_CLK_TCK")
    assert ticks == pytest.approx((times.user + times.system) * hz, abs=2)


def test_core_percent_is_cpu_seconds_over_wall_seconds() -> None:
    assert core_percent(30, 15.0, 100) == pytest.approx(2.0)
    assert core_percent(0, 15.0, 100) == 0.0


def test_a_ratio_target_is_met_only_when_the_whole_interval_is_at_or_above_it() -> None:
    above = stat([1.0, 0.995, 1.01, 0.998, 1.002])
    assert ratio_cell(above, 0.99) == "1.000x [0.995x, 1.010x] 94%: met"
    # the median (0.995x) meets 0.99x, but the interval's low end (0.97x) does not
    reaching = stat([0.97, 0.995, 1.01, 0.998, 0.993])
    cell = ratio_cell(reaching, 0.99)
    assert cell.startswith("0.995x [0.970x, 1.010x] 94%: **missed**")
    assert "reaches -0.020x below it" in cell


def test_the_steps_line_is_found_behind_sshddp_s_prefix() -> None:
    lines = ["READY 0 1.5", "[h1 r0] STEPS 187.809", "done"]
    assert steps_rate(lines) == pytest.approx(187.809)
    with pytest.raises(BenchError, match="no STEPS line"):
        steps_rate(["READY 0 1.5"])


def test_the_steps_table_judges_the_ratio_of_medians_and_the_paired_interval() -> None:
    row = StepsRow(stat([190.0, 180.0, 185.0]), stat([200.0, 190.0, 195.0]), stat([0.95] * 3))
    table = "\n".join(steps_table(row))
    assert "| 0.949x | **missed**: 0.949x |" in table
    assert "0.950x [0.950x, 0.950x]" in table


def test_the_relay_verdict_takes_the_worst_node_of_every_repetition() -> None:
    row = RelayRow(stat([1.0, 1.5, 2.4]), stat([0.2]), stat([3.0]), stat([1000.0]))
    table = "\n".join(relay_table(row))
    assert "**missed**: 2.40 % at worst" in table
    ok = RelayRow(stat([1.0, 1.5, 1.9]), stat([0.2]), stat([3.0]), stat([1000.0]))
    assert "| met |" in "\n".join(relay_table(ok))
