"""Recorded runs for the completion tests, unit and integration."""

from __future__ import annotations

from sshddp.model.inventory import parse_inventory
from sshddp.model.plan import CodeSpec, LaunchOptions, make_plan
from sshddp.run import registry
from sshddp.run.registry import RunRecord

RUN_IDS = ("abc123", "abd456", "zzz999")


INVENTORY = "hosts:\n  - {host: unreachable.invalid, nproc: 1}\n"


def record_runs() -> None:
    inv = parse_inventory(INVENTORY, source="inv.yaml")
    for run_id in RUN_IDS:
        code = CodeSpec("remote", "train.py")
        plan = make_plan(inv, LaunchOptions(script="train.py"), run_id, code, lambda h: "10.9.9.9")
        registry.save(RunRecord.of(plan, "inv.yaml", None))
