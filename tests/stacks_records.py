"""Run records for the stacks CLI tests, unit and integration."""

from __future__ import annotations

import sys
from pathlib import Path

from sshddp.model.inventory import Host
from sshddp.run import registry
from sshddp.run.registry import NodeRecord, RunRecord


def record(tmp_path: Path, *hosts: Host) -> RunRecord:
    nodes = tuple(
        NodeRecord(i, 1, str(tmp_path / "runs" / "r1" / f"n{i}"), h) for i, h in enumerate(hosts)
    )
    made = RunRecord(
        run_id="r1",
        created=0.0,
        inventory=str(tmp_path / "inv.yaml"),
        ssh_config=None,
        log_dir=str(tmp_path / "logs" / "r1"),
        rdzv=("127.0.0.1", 29500),
        world_size=len(hosts),
        grace=1.0,
        heartbeat_timeout=5.0,
        code="train.py",
        args=(),
        nodes=nodes,
    )
    registry.save(made)
    return made


def local(index: int) -> Host:
    return Host("localhost", index, python=sys.executable)
