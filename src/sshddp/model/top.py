"""``sshddp top``'s view of a run: a row per node and per rank, from each node's latest
sample (``remote/calls/node_sampler.py``) and the step rate its ranks' progress bars show, with
the slow one named, and the straggler of a coupled run (``straggler``).

Pure. A rank is slow when its steps per second fall below SLOW_BELOW times the median of
the run's ranks; a GPU is idle when its utilisation falls below SLOW_BELOW times the median
of the run's GPUs while that median is at least BUSY (the others work). A rank's text is
believed only so far: a rate above MAX_RATE is none, and the sparklines are scaled to the
ranks that agree with the others (``trend_top``), so one rank's claim can neither mark an
honest rank slow nor flatten the others' lines.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, replace
from typing import Any, Optional

from sshddp.model import straggler
from sshddp.model.bars import last_state
from sshddp.model.straggler import Waits
from sshddp.protocol.contract import GpuSample, SampleRecord

SLOW_BELOW = 0.5
BUSY = 20.0  #: % utilisation: a median below this means no GPU works, so none is idle
MAX_RATE = 1e5  #: steps per second beyond any training step: a bar claiming more shows none
OUTLIER = 10.0  #: a rank whose median rate is this many times the others' scales no line
_ANSI = re.compile(rb"\x1b\[[0-9;:?]*[A-Za-z]")
_PER_SECOND = re.compile(rb"(?<![\w.])(\d+(?:\.\d+)?)\s?(?:it|its|steps?|batch(?:es)?)/s\b")
_SECONDS_PER = re.compile(rb"(?<![\w.])(\d+(?:\.\d+)?)\s?s/(?:it|step|batch)\b")
_LINES = 4  #: lines of a rank's tail looked at for a bar, from the last


def step_rate(tail: bytes) -> Optional[float]:
    """Steps per second from the latest progress bar in ``tail`` (tqdm's ``9.80it/s`` or
    ``2.51s/it``, as tqdm, Lightning's bars and rich draw them); None when none shows one."""
    for line in reversed(tail.split(b"\n")[-_LINES:]):
        state = _ANSI.sub(b"", last_state(line))
        fast = list(_PER_SECOND.finditer(state))
        slow = list(_SECONDS_PER.finditer(state))
        last = max(fast + slow, key=lambda m: m.start(), default=None)
        if last is None:
            continue
        value = float(last.group(1))
        rate = (1.0 / value if value > 0 else None) if last in slow else value
        return rate if rate is not None and rate <= MAX_RATE else None
    return None


@dataclass(frozen=True)
class RankRow:
    """One rank of the run at the snapshot."""

    rank: int
    host: str
    node_rank: int
    pid: int
    cpu: Optional[float]  #: % of one core
    rss: int  #: bytes
    steps_per_s: Optional[float]
    quiet: Optional[float]  #: seconds since its last output
    gpu: Optional[GpuSample]  #: the GPU it uses (local rank's), when the node has GPUs
    slow: bool = False
    #: its step rate over the last minute, oldest first (None: no bar at that point)
    trend: tuple[Optional[float], ...] = ()
    waits: Optional[Waits] = None  #: its stack samples over the last window
    straggler: bool = False  #: the others wait for it (``straggler.judge``)


@dataclass(frozen=True)
class NodeRow:
    """One node of the run at the snapshot."""

    node_rank: int
    host: str
    state: str
    sample: Optional[SampleRecord]
    idle_gpus: tuple[int, ...] = ()  #: its GPUs whose utilisation lags the run's others
    error: str = ""  #: why it has no answer
    #: a spare seated mid-run in this node rank: ``node 2: h4 since attempt 2 (h3 lost)``
    replaced: str = ""


def rank_rows(
    node: NodeRow,
    tails: dict[str, str],
    now: float,
    history: Optional[dict[str, list[list[Any]]]] = None,
    waits: Optional[dict[str, list[list[Any]]]] = None,
) -> list[RankRow]:
    """The node's ranks from its sample, each with its step rate, quiet time, the step
    rates of its bars over the last minute and its stack samples (``history``, ``waits``:
    the node's answer)."""
    if node.sample is None:
        return []
    gpus = node.sample["gpus"]
    rows = []
    for r in node.sample["ranks"]:
        local = r["local_rank"]
        tail = tails.get(str(local), "").encode("utf-8", "replace")
        seen = r["last_output"]
        gpu = gpus[local % len(gpus)] if gpus and local is not None else None
        rows.append(
            RankRow(
                r["rank"],
                node.host,
                node.node_rank,
                r["pid"],
                r["cpu"],
                r["rss"],
                step_rate(tail),
                round(now - seen, 1) if seen else None,
                gpu,
                trend=trend((history or {}).get(str(local), [])),
                waits=straggler.waits_of((waits or {}).get(str(local), [])),
            )
        )
    return rows


def trend(points: list[list[Any]]) -> tuple[Optional[float], ...]:
    """The step rates of a rank's bars at each point of its history."""
    return tuple(step_rate(str(text).encode("utf-8", "replace")) for _, text in points)


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: tuple[Optional[float], ...], top: Optional[float]) -> str:
    """``values`` as bars scaled to ``top`` (the run's fastest rate, so a slow rank's line
    sits low beside the others'); a blank where a point had no rate."""
    if not top or top <= 0:
        return " " * len(values)
    last = len(SPARKS) - 1
    return "".join(
        " " if v is None else SPARKS[max(0, min(last, round(v / top * last)))] for v in values
    )


def trend_top(rows: list[RankRow]) -> Optional[float]:
    """The rate the sparklines are scaled to: the highest 90th percentile of a rank's
    history among the ranks whose median rate is within OUTLIER times the lower median of
    every rank's (a lone rank claiming far more, or one spike, flattens no line)."""
    kept = [sorted(v for v in r.trend if v is not None) for r in rows]
    kept = [k for k in kept if k]
    if not kept:
        return None
    typical = statistics.median_low(statistics.median(k) for k in kept)
    agree = [k for k in kept if statistics.median(k) <= OUTLIER * typical]
    return max(k[min(len(k) - 1, int(0.9 * len(k)))] for k in agree)


def median_rate(rows: list[RankRow]) -> Optional[float]:
    rates = [r.steps_per_s for r in rows if r.steps_per_s is not None]
    return statistics.median(rates) if len(rates) >= 2 else None


def flag_slow(rows: list[RankRow]) -> list[RankRow]:
    """``rows`` with ``slow`` set on each rank well below the median step rate, and
    ``straggler`` on each rank the others wait for."""
    median = median_rate(rows)
    named = {s.rank for s in stragglers(rows)}
    return [
        RankRow(
            **{
                **r.__dict__,
                "slow": median is not None
                and median > 0
                and r.steps_per_s is not None
                and r.steps_per_s < SLOW_BELOW * median,
                "straggler": r.rank in named,
            }
        )
        for r in rows
    ]


def stragglers(rows: list[RankRow]) -> list[straggler.Straggler]:
    return straggler.judge([(r.rank, r.host, r.waits) for r in rows])


def idle_gpus(nodes: list[NodeRow]) -> list[NodeRow]:
    """``nodes`` with ``idle_gpus`` set: GPUs well below the run's median utilisation."""
    utils = [
        g["util"] for n in nodes if n.sample for g in n.sample["gpus"] if g["util"] is not None
    ]
    median = statistics.median(utils) if len(utils) >= 2 else None
    if median is None or median < BUSY:
        return nodes
    out = []
    for n in nodes:
        gpus = n.sample["gpus"] if n.sample else []
        lagging = tuple(
            g["index"] for g in gpus if g["util"] is not None and g["util"] < SLOW_BELOW * median
        )
        out.append(replace(n, idle_gpus=lagging))
    return out


def summary(rows: list[RankRow]) -> str:
    """One line in ``stacks``' language: the straggler the others wait for, the slow
    ranks, or that none is."""
    found = stragglers(rows)
    if found:
        return straggler.line(found)
    median = median_rate(rows)
    slow = [r for r in rows if r.slow]
    rated = [r for r in rows if r.steps_per_s is not None]
    if median is None and len(rated) == 1:
        (one,) = rated  # Lightning, transformers: rank 0 alone draws the run's bar
        return f"{one.steps_per_s:.3g} it/s (rank {one.rank} on {one.host} alone draws a bar)"
    if median is None:
        return "no step rate known (no progress bar with a rate in any rank's output)"
    if not slow:
        return f"no slow rank: median {median:.3g} it/s"
    named = "; ".join(f"rank {r.rank} on {r.host}, {r.steps_per_s:.3g} it/s" for r in slow)
    return f"slow: {named} against a median of {median:.3g}"


def json_doc(run_id: str, at: float, nodes: list[NodeRow], rows: list[RankRow]) -> dict[str, Any]:
    """The snapshot as one JSON document (null where a value is not known)."""
    return {
        "run_id": run_id,
        "at": at,
        "summary": summary(rows),
        "ranks": [
            {
                "rank": r.rank,
                "host": r.host,
                "node_rank": r.node_rank,
                "pid": r.pid,
                "cpu": r.cpu,
                "rss": r.rss,
                "steps_per_s": r.steps_per_s,
                "quiet": r.quiet,
                "slow": r.slow,
                "gpu_util": r.gpu["util"] if r.gpu else None,
                "gpu_mem": r.gpu["mem_used"] if r.gpu else None,
                "trend": list(r.trend),
                "waits": round(r.waits.share, 3) if r.waits else None,
                "stack_samples": r.waits.samples if r.waits else 0,
                "straggler": r.straggler,
            }
            for r in rows
        ],
        "stragglers": [s.__dict__ for s in stragglers(rows)],
        "nodes": [
            {
                "node_rank": n.node_rank,
                "host": n.host,
                "state": n.state,
                "cpu": n.sample["cpu"] if n.sample else None,
                "rss": n.sample["rss"] if n.sample else None,
                "gpus": n.sample["gpus"] if n.sample else [],
                "idle_gpus": list(n.idle_gpus),
                "error": n.error or None,
                "replaced": n.replaced or None,
            }
            for n in nodes
        ],
    }


def _num(value: Optional[float], fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _size(n: Optional[int]) -> str:
    if n is None:
        return "-"
    for unit in ("B", "K", "M", "G"):
        if n < 1024:
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n = n / 1024  # type: ignore[assignment]
    return f"{n:.1f}T"


def render(nodes: list[NodeRow], rows: list[RankRow]) -> str:
    """The snapshot as a table: the nodes (and their GPUs), then the ranks."""
    out = [n.replaced for n in nodes if n.replaced]
    out.append("NODE HOST             STATE      CPU%      RSS  GPU")
    for n in nodes:
        s = n.sample
        gpus = s["gpus"] if s else []
        what = n.error or ("no GPU" if s else "no sample yet")
        out.append(
            f"{n.node_rank:>4} {n.host:<16} {n.state:<9} {_num(s['cpu'] if s else None, '.0f'):>5} "
            f"{_size(s['rss'] if s else None):>8}  {'' if gpus else what}"
        )
        for g in gpus:
            flag = "  IDLE" if g["index"] in n.idle_gpus else ""
            out.append(
                f"{'':>5}gpu{g['index']} {g['name']:<20} {_num(g['util'], '.0f'):>4}% "
                f"{_size(g['mem_used'])}/{_size(g['mem_total'])} {_num(g['power'], '.0f')}W "
                f"{_num(g['temp'], '.0f')}C{flag}"
            )
    out.append(
        "RANK HOST             CPU%      RSS   STEP/S  QUIET  WAIT%  GPU%  GPUMEM  LAST MINUTE"
    )
    top = trend_top(rows)
    for r in rows:
        flags = ("  SLOW" if r.slow else "") + ("  STRAGGLER" if r.straggler else "")
        out.append(
            f"{r.rank:>4} {r.host:<16} {_num(r.cpu, '.0f'):>5} {_size(r.rss):>8} "
            f"{_num(r.steps_per_s, '.3g'):>8} {_num(r.quiet, '.0f'):>5}s "
            f"{_num(100 * r.waits.share if r.waits else None, '.0f'):>6} "
            f"{_num(r.gpu['util'] if r.gpu else None, '.0f'):>5} "
            f"{_size(r.gpu['mem_used'] if r.gpu else None):>7}  "
            f"{sparkline(r.trend[-_TREND:], top):<{_TREND}}{flags}".rstrip()
        )
    return "\n".join(out)


_TREND = 12  #: points of the sparkline: a minute, one every 5 seconds
