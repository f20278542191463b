"""``sshddp top``'s pure parts: step rates read from real bars, the slow rank and the idle
GPU flagged, the one-line summary."""

from __future__ import annotations

from sshddp.model import top
from sshddp.model.top import NodeRow, RankRow
from sshddp.protocol.contract import GpuSample, SampleRecord

TQDM = (
    b"rank 4:   0%|          | 0/10000000 [00:00<?, ?it/s]\r"
    b"rank 4:   0%|          | 12/10000000 [00:02<1:02:10,  4.91it/s]\r"
    b"rank 4:   0%|          | 14/10000000 [00:03<1:02:11,  4.87it/s]"
)
TQDM_SLOW = b"train:   2%|2         | 3/120 [00:07<04:53,  2.51s/it]"
LIGHTNING_TQDM = (
    b"Epoch 0:  40%|\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88      | 40/100 "
    b"[00:04<00:06,  9.80it/s, v_num=0, train_loss=0.512]"
)
RICH = (
    b"\x1b[?25l\x1b[2KEpoch 0/9 \x1b[38;5;237m\xe2\x94\x81\xe2\x94\x81\x1b[0m 40/100 "
    b"0:00:04 \xe2\x80\xa2 0:00:06 \x1b[2m12.50it/s\x1b[0m v_num: 0 loss: 0.51"
)


def test_step_rate_from_tqdm_lightning_and_rich_bars() -> None:
    assert top.step_rate(TQDM) == 4.87  # the latest state after the \r redraws
    assert top.step_rate(b"some log line\n" + TQDM_SLOW) == 1 / 2.51
    assert top.step_rate(LIGHTNING_TQDM + b"\n") == 9.80  # the bar finished by a newline
    assert top.step_rate(RICH) == 12.5
    assert top.step_rate(b"rank 0:   0%|  | 0/10 [00:00<?, ?it/s]") is None
    assert top.step_rate(b"downloaded at 12.0MB/s\nloss 0.5\n") is None
    assert top.step_rate(b"") is None


def _row(rank: int, rate: float | None, host: str = "h1") -> RankRow:
    return RankRow(rank, host, rank // 2, 100 + rank, 99.0, 1 << 20, rate, 0.5, None)


def test_the_rank_well_below_the_median_is_slow_and_named() -> None:
    rows = top.flag_slow([_row(r, 4.0 if r == 4 else 20.0, f"h{r // 2 + 1}") for r in range(6)])
    assert [r.rank for r in rows if r.slow] == [4]
    assert top.summary(rows) == "slow: rank 4 on h3, 4 it/s against a median of 20"


def test_no_rank_is_slow_when_the_rates_are_close_or_unknown() -> None:
    even = top.flag_slow([_row(r, 10.0 + r) for r in range(4)])
    assert not any(r.slow for r in even)
    assert top.summary(even) == "no slow rank: median 11.5 it/s"
    unknown = top.flag_slow([_row(0, None), _row(1, None)])
    assert not any(r.slow for r in unknown)
    assert top.summary(unknown).startswith("no step rate known")


def test_a_bar_on_rank_0_alone_is_the_runs_rate() -> None:
    """Lightning and transformers draw their bar on rank 0 only: its rate is the run's."""
    rows = top.flag_slow([_row(0, 3.0), _row(1, None, "h2")])
    assert not any(r.slow for r in rows)
    assert top.summary(rows) == "3 it/s (rank 0 on h1 alone draws a bar)"


def _gpu(index: int, util: float | None) -> GpuSample:
    return {
        "index": index,
        "name": "NVIDIA H200",
        "util": util,
        "mem_used": 1 << 30,
        "mem_total": 141 << 30,
        "power": 300.0,
        "temp": 40.0,
    }


def _node(rank: int, utils: list[float | None]) -> NodeRow:
    sample: SampleRecord = {
        "schema": 7,
        "at": 0.0,
        "node_rank": rank,
        "cpu": 100.0,
        "rss": 1 << 30,
        "ranks": [],
        "gpus": [_gpu(i, u) for i, u in enumerate(utils)],
        "gpu_source": "nvml",
    }
    return NodeRow(rank, f"h{rank + 1}", "running", sample)


def test_a_gpu_far_below_the_others_is_idle_unless_none_works() -> None:
    nodes = top.idle_gpus([_node(0, [95.0, 97.0]), _node(1, [3.0, 96.0])])
    assert [n.idle_gpus for n in nodes] == [(), (0,)]
    quiet = top.idle_gpus([_node(0, [2.0, 0.0]), _node(1, [1.0, None])])
    assert [n.idle_gpus for n in quiet] == [(), ()]
    assert "IDLE" in top.render(nodes, [])


def test_rank_rows_read_rate_quiet_time_and_gpu_from_a_node_answer() -> None:
    node = _node(1, [90.0, 10.0])
    assert node.sample is not None
    node.sample["ranks"] = [
        {
            "rank": 2,
            "local_rank": 0,
            "pid": 7,
            "cpu": 98.5,
            "rss": 5 << 20,
            "out_bytes": 900,
            "last_output": 95.0,
        },
        {
            "rank": 3,
            "local_rank": 1,
            "pid": 8,
            "cpu": None,
            "rss": 6 << 20,
            "out_bytes": 0,
            "last_output": None,
        },
    ]
    rows = top.rank_rows(node, {"0": TQDM.decode("utf-8")}, 100.0)
    assert [(r.rank, r.host, r.steps_per_s, r.quiet) for r in rows] == [
        (2, "h2", 4.87, 5.0),
        (3, "h2", None, None),
    ]
    doc = top.json_doc("r1", 1.0, [node], rows)
    assert doc["ranks"][0]["gpu_util"] == 90.0 and doc["ranks"][1]["gpu_util"] == 10.0
    assert doc["ranks"][1]["cpu"] is None and doc["ranks"][1]["steps_per_s"] is None
    assert set(doc["ranks"][0]) >= {"rank", "host", "cpu", "rss", "steps_per_s", "slow"}
    assert doc["nodes"][0]["gpus"][0]["name"] == "NVIDIA H200"


def _bar(rate: float) -> str:
    return f"rank 0:   1%|1         | 120/10000 [00:10<13:42, {rate:5.2f}it/s]"


def test_a_ranks_last_minute_is_a_sparkline_scaled_to_the_runs_fastest() -> None:
    node = _node(0, [])
    assert node.sample is not None
    node.sample["ranks"] = [
        {
            "rank": r,
            "local_rank": r,
            "pid": 7 + r,
            "cpu": 1.0,
            "rss": 1,
            "out_bytes": 9,
            "last_output": 99.0,
            "last_span": [0, 9],
        }  # fmt: skip
        for r in (0, 1)
    ]
    history = {
        "0": [[t, _bar(24.0)] for t in range(12)],
        "1": [[0, "loading data\n"], *[[t, _bar(24.0 - 2 * t)] for t in range(1, 12)]],
    }
    rows = top.flag_slow(top.rank_rows(node, {}, 100.0, history))
    assert rows[0].trend == (24.0,) * 12
    assert rows[1].trend[0] is None and rows[1].trend[-1] == 2.0
    table = top.render([node], rows).splitlines()
    assert table[-2].endswith("  " + "█" * 12), table
    assert table[-1].endswith("  " + " ▇▇▆▆▅▅▄▃▃▂▂"), table
    assert top.json_doc("r1", 1.0, [node], rows)["ranks"][1]["trend"][:2] == [None, 22.0]


def test_no_history_is_no_sparkline() -> None:
    assert top.sparkline((None, None), None) == "  "
    assert top.sparkline((), 3.0) == ""
    assert top.sparkline((0.0, 1.5, 3.0), 3.0) == "▁▅█"


def test_a_ranks_text_cannot_claim_any_rate() -> None:
    """A rank printing an absurd rate shows none: the honest rank beside it is not slow."""
    liar = b"x: 1%| | 5/9 [00:01<00:01, 99999999999999999999999it/s]"
    assert top.step_rate(liar) is None
    assert top.step_rate(b"x: 1%| | 5/9 [00:01<00:01, 0.000001s/it]") is None
    assert top.step_rate(b"x: 1%| | 5/9 [00:01<00:01, 90000.00it/s]") == 90000.0
    rows = top.flag_slow([_row(0, top.step_rate(liar)), _row(1, 5.0)])
    assert not any(r.slow for r in rows)


def test_one_ranks_claim_flattens_no_sparkline() -> None:
    """The lines are scaled to the ranks that agree: one rank claiming far more (or one
    spike in a rank's minute) draws at the top and leaves the others' lines readable."""
    honest = RankRow(0, "h1", 0, 7, 1.0, 1, 24.0, 0.5, None, trend=(24.0,) * 11 + (2400.0,))
    slow = RankRow(1, "h1", 0, 8, 1.0, 1, 12.0, 0.5, None, trend=(12.0,) * 12)
    claim = RankRow(2, "h2", 1, 9, 1.0, 1, 9e4, 0.5, None, trend=(9e4,) * 12)
    assert top.trend_top([honest, slow, claim]) == 24.0
    table = top.render([], [honest, slow, claim]).splitlines()
    assert table[-3].endswith("█" * 12) and table[-2].endswith("▅" * 12), table
    assert table[-1].endswith("█" * 12), table
    assert top.trend_top([claim, slow]) == 12.0  # two ranks: the lower one is believed
