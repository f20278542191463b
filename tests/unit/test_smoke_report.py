"""``sshddp smoke``'s findings (model.smoke): every host that took part is named, node 0
(which has no link of its own to measure) included."""

from __future__ import annotations

import json
from typing import Any

from sshddp.model.smoke import SmokeReport, render, to_json


def _record(nodes: int, procs: int) -> dict[str, Any]:
    n = nodes * procs
    return {
        "sshddp_smoke": 1,
        "backend": "gloo",
        "device": "cpu",
        "world_size": n,
        "joined": [{"rank": r, "node": r // procs, "local_rank": r % procs} for r in range(n)],
        "sum": n * (n + 1) // 2,
        "expected_sum": n * (n + 1) // 2,
        "allreduce": [{"bytes": 4096, "time_us": 10.0, "algbw_gbps": 0.4, "busbw_gbps": 0.6}],
        "p2p_bytes": 4096,
        "p2p": [{"node": k, "rank": k * procs, "gbps": 1.0} for k in range(1, nodes)],
    }


def test_every_host_is_named_node_0_included() -> None:
    report = SmokeReport(_record(2, 2), ("alpha", "beta"), (2, 2))
    text = render(report)
    assert "  node 0   alpha                2/2" in text
    assert "  node 1   beta                 2/2" in text
    nodes = json.loads(to_json(report))["nodes"]
    assert nodes == [
        {"node": 0, "host": "alpha", "ranks": 2, "joined": 2},
        {"node": 1, "host": "beta", "ranks": 2, "joined": 2},
    ]


def test_one_node_alone_is_named_too() -> None:
    report = SmokeReport(_record(1, 3), ("solo",), (3,))
    assert "  node 0   solo                 3/3" in render(report)
    assert report.ok


def test_a_node_short_of_ranks_shows_how_many_joined() -> None:
    record = _record(2, 2)
    record["joined"] = record["joined"][:3]
    report = SmokeReport(record, ("alpha", "beta"), (2, 2))
    assert "  node 1   beta                 1/2" in render(report)
    assert report.missing == [1] and not report.ok
