"""A run record for the registry tests, unit and integration."""

from __future__ import annotations

from sshddp.model.inventory import Host
from sshddp.model.plan import CodeSpec, LaunchPlan, NodePlan
from sshddp.run.registry import Launcher, RunRecord


def record(run_id: str = "r1", launcher: Launcher | None = None) -> RunRecord:
    nodes = tuple(
        NodePlan(Host(host=f"h{i}", index=i), i, 1, i, f"/w/runs/{run_id}/n{i}", "", {}, ())
        for i in range(2)
    )
    plan = LaunchPlan(run_id, nodes, "10.0.0.1", 29500, 2, CodeSpec("file", "t.py"), (), 1.0, "l")
    return RunRecord.of(plan, "inv.yaml", None, launcher)
