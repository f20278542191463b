"""What a run's end does to the quarantine: the hosts it implies are kept out of launches.

Whoever first learns how a run ended decides, once per run (the run's record says it was
decided): the launch or ``attach`` that followed it, from the failed nodes' log tails too,
else ``ps``, ``logs``, ``stop`` or ``attach`` from the states the hosts kept (a lost node
only: no log tail is read there).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Optional

from sshddp import defaults, trace
from sshddp.errors import StateError
from sshddp.model import quarantine as model
from sshddp.model.checks import HostReport
from sshddp.model.state import NodeState, RunResult
from sshddp.run import registry
from sshddp.run.quarantine import store
from sshddp.run.registry import RunRecord
from sshddp.run.sinks import tail_lines

TAIL = 400  #: lines of a failed node's log looked through for a hardware error


def after_run(result: RunResult) -> list[str]:
    """Quarantine the hosts a run's end implies, as a launch or attach saw it end; the
    report's lines naming them (a store that cannot take them: a warning line instead)."""
    tails = {
        n.node_rank: tail_lines(n.log_path, TAIL)
        for n in result.nodes
        if n.state is NodeState.FAILED and n.log_path is not None
    }
    return _judged(result.run_id, model.verdicts(result, tails))


def after_record(record: Optional[RunRecord]) -> list[str]:
    """The same, for an end ``ps``, ``logs`` or ``attach`` recorded from the hosts' states
    (``registry.record_end``'s answer; None: nothing new). No log tail: only a lost node."""
    if record is None:
        return []
    return _judged(record.run_id, model.verdicts(record.recorded_result(), {}))


def _judged(run_id: str, found: Sequence[model.Verdict]) -> list[str]:
    """Keep ``found`` unless this run's quarantine was decided already (by whoever learned
    of its end first: a host cleared since is not quarantined again by a later ``ps``)."""
    if not found:
        return []
    first, cooldown = True, None

    def claim(record: RunRecord) -> Optional[RunRecord]:
        nonlocal first, cooldown
        first, cooldown = not record.judged, record.quarantine_for
        return None if record.judged else replace(record, judged=True)

    try:
        registry.update(run_id, claim)
    except StateError as exc:
        return [f"sshddp: warning: not quarantined ({exc.message})"]
    return _keep(found, cooldown, run_id) if first else []


def after_preflight(
    reports: Sequence[HostReport], cooldown: Optional[float], run_id: str
) -> list[str]:
    """Quarantine the hosts a launch's preflight could not connect to, or that failed a
    health check."""
    return _keep(model.bad_at_launch(reports), cooldown, run_id)


def after_swap(found: Sequence[model.Verdict], cooldown: Optional[float]) -> list[str]:
    """Quarantine the hosts a launch swapped out for spares because it could not reach
    them (before the run has a name: the entries name none)."""
    return _keep(found, cooldown, "")


def _keep(found: Sequence[model.Verdict], cooldown: Optional[float], run_id: str) -> list[str]:
    now = time.time()
    wait = defaults.QUARANTINE_FOR if cooldown is None else cooldown
    entries = model.entries(found, now, wait, run_id)
    if not entries:
        return []
    if trace.on():
        trace.log.info("quarantine: %s", "; ".join(model.line(e) for e in entries))
    try:
        store.change(lambda kept: kept.adding(entries, now))
    except StateError as exc:
        return [f"sshddp: warning: not quarantined ({exc.message})"]
    return [f"sshddp: {model.line(e)}" for e in entries]
