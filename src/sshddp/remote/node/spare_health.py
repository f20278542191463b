"""A spare's look at its own health when node 0 needs it mid-run (``check``): the fast look
a launch's preflight takes at a host (``calls/host_health``: the inventory's ``health:``
command, and ``nvidia-smi -q`` where NVIDIA's driver knows GPUs), within the same timeout,
judged as the preflight judges it (``protocol/health_command``, ``protocol/gpu_health``:
a finding at ``fail`` makes the spare unhealthy). The spare's spec says what to run
(``SpecRecord.health``); a spare with no command and no GPU answers healthy at once.
"""

from __future__ import annotations

from typing import Any, Mapping

from sshddp.protocol import gpu_health
from sshddp.protocol.contract import SpecRecord
from sshddp.protocol.health_command import command_problem
from sshddp.remote.calls import host_health

DEFAULT_TIMEOUT = 8.0  #: seconds, where the spec does not say (the launch's own budget)


def problem(spec: SpecRecord, env: Mapping[str, str]) -> str:
    """What the spare's look found wrong ("" when healthy)."""
    args: Mapping[str, Any] = spec.get("health") or {}
    command = str(args.get("command") or "")
    timeout = float(args.get("timeout") or DEFAULT_TIMEOUT)
    looks = {"hardware": "gpus", "command": command, "timeout": timeout, "keep": args.get("keep")}
    try:
        facts = host_health.finish(host_health.start(looks, env)) or {}
    except OSError as exc:  # /bin/sh or nvidia-smi cannot start: say so, never a traceback
        return f"its health look could not run: {exc}"
    return judged(facts, command, timeout, args.get("gpus"))


def judged(facts: Mapping[str, Any], command: str, timeout: float, gpus: Any = None) -> str:
    """``host_health``'s facts judged: each finding at ``fail``, in words ("" when none)."""
    found = []
    if command:
        found.append(command_problem(command, facts.get("command") or {}, timeout))
    if "smi" in facts or facts.get("gpu_dev_count"):
        expected = gpus if isinstance(gpus, int) else None
        found += gpu_health.smi_problems(
            facts.get("smi"), expected, facts.get("gpu_dev_count") or 0
        )
    return "; ".join(message for level, message, _ in found if level == "fail")
