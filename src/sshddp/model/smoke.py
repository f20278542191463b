"""Pure: what ``sshddp smoke`` concludes from the record its job's rank 0 printed.

The record (``jobs/smoke.py``) holds who joined, the all-reduce's sum, the all-reduce's
timings by size and each node's link to node 0. Here: the verdict (every rank joined, the
sum exact), which node's link is far slower than the others', the table and the JSON.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

SMOKE_RECORD = "sshddp_smoke"  #: the key of the job's record (jobs/smoke.py)
SLOW_FRACTION = 0.5  #: a link below this share of the others' median is named slow


@dataclass(frozen=True)
class SmokeReport:
    """The smoke test's findings, from the job's record and the plan's hosts."""

    record: dict[str, Any]
    hosts: tuple[str, ...]  #: host names by node rank
    procs: tuple[int, ...]  #: processes planned on each node

    @property
    def joined(self) -> list[int]:
        """Ranks joined on each node, by node rank."""
        counts = [0] * len(self.hosts)
        for j in self.record.get("joined", []):
            if 0 <= j["node"] < len(counts):
                counts[j["node"]] += 1
        return counts

    @property
    def missing(self) -> list[int]:
        """Nodes with fewer ranks joined than planned."""
        return [k for k, c in enumerate(self.joined) if c < self.procs[k]]

    def nodes(self) -> list[dict[str, Any]]:
        """Every node that took part, node 0 included: its host and its ranks."""
        return [
            {"node": k, "host": host, "ranks": self.procs[k], "joined": self.joined[k]}
            for k, host in enumerate(self.hosts)
        ]

    @property
    def sum_ok(self) -> bool:
        return self.record.get("sum") == self.record.get("expected_sum")

    @property
    def ok(self) -> bool:
        return not self.missing and self.sum_ok

    def slow_nodes(self) -> list[int]:
        """Nodes whose link to node 0 is below ``SLOW_FRACTION`` of the others' median."""
        import statistics  # only smoke needs it; every command imports this module

        links = {p["node"]: p["gbps"] for p in self.record.get("p2p", [])}
        slow = []
        for node, gbps in links.items():
            others = [g for k, g in links.items() if k != node]
            if others and gbps < SLOW_FRACTION * statistics.median(others):
                slow.append(node)
        return sorted(slow)

    def peak_busbw(self) -> float:
        return max((r["busbw_gbps"] for r in self.record.get("allreduce", [])), default=0.0)


def find_record(lines: Sequence[str]) -> Optional[dict[str, Any]]:
    """The job's record among node 0's output lines (the last one, if several)."""
    for line in reversed(lines):
        if line.startswith("{") and SMOKE_RECORD in line:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and SMOKE_RECORD in record:
                return record
    return None


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def render(report: SmokeReport) -> str:
    """The terminal's text: who joined, the all-reduce table, each node's link, a verdict."""
    r = report.record
    out = [
        f"sshddp smoke: {r['world_size']} ranks on {len(report.hosts)} node(s), "
        f"{r['backend']} on {r['device']}",
        f"all-reduce sum: {r['sum']} (expected {r['expected_sum']}): "
        + ("exact" if report.sum_ok else "WRONG"),
        "",
        "nodes (ranks joined of planned):",
        *(
            f"  node {n['node']:<3} {n['host']:<20} {n['joined']}/{n['ranks']}"
            for n in report.nodes()
        ),
        "",
        f"{'size':>10} {'time (us)':>12} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}",
    ]
    for row in r["allreduce"]:
        out.append(
            f"{_size(row['bytes']):>10} {row['time_us']:>12.1f} {row['algbw_gbps']:>13.3f} "
            f"{row['busbw_gbps']:>13.3f}"
        )
    out += ["", f"link to node 0 ({_size(r['p2p_bytes'])} each way, send/recv):"]
    slow = report.slow_nodes()
    if not r["p2p"]:
        out.append("  (one node: no link to measure)")
    for p in r["p2p"]:
        mark = "  <- far below the others" if p["node"] in slow else ""
        out.append(
            f"  node {p['node']:<3} {report.hosts[p['node']]:<20} {p['gbps']:>9.3f} GB/s{mark}"
        )
    out += ["", verdict(report)]
    return "\n".join(out)


def verdict(report: SmokeReport) -> str:
    problems = [f"node {k} ({report.hosts[k]}) did not join" for k in report.missing]
    if not report.sum_ok:
        problems.append("the all-reduce's sum is wrong")
    problems += [
        f"node {k} ({report.hosts[k]}) has a link to node 0 far below the others'"
        for k in report.slow_nodes()
    ]
    if not problems:
        peak = report.peak_busbw()
        return f"ok: every rank joined, the sum is exact; peak bus bandwidth {peak:.3f} GB/s"
    return ("FAIL: " if not report.ok else "warn: ") + "; ".join(problems)


def to_json(report: SmokeReport) -> str:
    r = report.record
    links = [
        {**p, "host": report.hosts[p["node"]], "slow": p["node"] in report.slow_nodes()}
        for p in r["p2p"]
    ]
    doc = {
        "ok": report.ok,
        "world_size": r["world_size"],
        "backend": r["backend"],
        "device": r["device"],
        "sum": r["sum"],
        "expected_sum": r["expected_sum"],
        "nodes": report.nodes(),
        "missing_nodes": report.missing,
        "allreduce": r["allreduce"],
        "p2p_bytes": r["p2p_bytes"],
        "links": links,
        "slow_nodes": report.slow_nodes(),
        "joined": r["joined"],
    }
    return json.dumps(doc, indent=2)
