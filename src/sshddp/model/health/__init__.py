"""Pure: what ``doctor --health``'s facts (``remote/calls/host_health.py``) say of a host.

Each look gives problems as (level, message, fix), level ``ok`` (a note), ``warn`` or
``fail``; ``model/checks.py`` makes them findings. The GPUs' looks are in ``gpus``; here are
the inventory's ``health:`` command, the InfiniBand/RoCE ports and DCGM's diagnostic.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Optional

# the health: command's judge runs on the hosts too (a spare's look when it is needed)
from sshddp.protocol.health_command import Level, Problem, command_problem

__all__ = ["Level", "Problem", "command_problem", "dcgm_problems", "ib_problems"]


# --- InfiniBand / RoCE ---------------------------------------------------------------------


def ib_problems(ports: Sequence[Mapping[str, Any]]) -> list[Problem]:
    """Each port's state, and its ``link_downed`` counter: one that rose while the probe
    looked fails (the link flaps now), one above zero warns."""
    problems: list[Problem] = []
    for port in ports:
        name = f"{port.get('dev')} port {port.get('port')}"
        state = str(port.get("state") or "")
        downed, before = port.get("link_downed"), port.get("link_downed_before")
        if state and "ACTIVE" not in state:
            fix = f"check the cable and the switch port (`ibstat {port.get('dev')}`)"
            problems.append(("warn", f"{name}: {state} ({port.get('phys_state')})", fix))
        if isinstance(downed, int) and isinstance(before, int) and downed > before:
            problems.append(
                (
                    "fail",
                    f"{name}: link went down {downed - before} time(s) while checked",
                    "the link flaps: check the cable, transceiver and switch port",
                )
            )
        elif isinstance(downed, int) and downed > 0:
            problems.append(
                (
                    "warn",
                    f"{name}: link_downed is {downed} since the counter was reset",
                    "if it keeps rising, check the cable, transceiver and switch port",
                )
            )
    return problems


_DCGM_ROW = re.compile(r"^\|\s*(?P<test>[^|]+?)\s*\|\s*(?P<result>Pass|Fail|Warn|Skip)\b", re.I)


def dcgm_problems(result: Optional[Mapping[str, Any]]) -> list[Problem]:
    """``dcgmi diag -r 1``'s table: every test that failed (or warned); no dcgmi: a note."""
    if result is None:
        return [("ok", "no dcgmi on PATH: DCGM's diagnostic not run", "")]
    output = str(result.get("output") or "")
    if result.get("timed_out"):
        return [
            ("fail", "dcgmi diag -r 1 did not finish in time", "run `dcgmi diag -r 1` on the host")
        ]
    rows = [m for m in map(_DCGM_ROW.match, output.splitlines()) if m]
    problems: list[Problem] = []
    for row in rows:
        verdict = row.group("result").lower()
        if verdict in ("fail", "warn"):
            level: Level = "fail" if verdict == "fail" else "warn"
            problems.append(
                (
                    level,
                    f"dcgmi diag: {row.group('test')}: {row.group('result')}",
                    "run `dcgmi diag -r 1 -v` on the host for the details",
                )
            )
    if not rows:
        tail = " | ".join(output.strip().splitlines()[-2:]) or "no output"
        return [
            (
                "warn",
                f"dcgmi diag -r 1 exited {result.get('exit')} with no results: {tail}",
                "check that the DCGM host engine runs (`nv-hostengine`)",
            )
        ]
    return problems or [("ok", f"dcgmi diag -r 1: {len(rows)} tests passed", "")]
