"""A spare's look at its own health when node 0 needs it mid-run (``check``): the launch's
look at a host (``calls/host_health``: the inventory's ``health:`` command, run as the
launch runs it, within the same timeout), judged as the launch judges it
(``protocol/health_command``). The spare's spec carries what to run (``SpecRecord.health``);
a spare without a ``health:`` command answers healthy at once.
"""

from __future__ import annotations

from typing import Mapping

from sshddp.protocol.contract import SpecRecord
from sshddp.protocol.health_command import command_problem
from sshddp.remote.calls import host_health


def problem(spec: SpecRecord, env: Mapping[str, str]) -> str:
    """What the spare's look found wrong ("" when healthy)."""
    args = spec.get("health")
    command = str(args.get("command") or "") if args else ""
    if not args or not command:
        return ""
    timeout = float(args.get("timeout") or 8.0)
    looks = {"hardware": False, "command": command, "timeout": timeout, "keep": args.get("keep")}
    try:
        facts = host_health.finish(host_health.start(looks, env)) or {}
    except OSError as exc:  # /bin/sh cannot start: say so, never a traceback
        return f"`{command}` could not run: {exc}"
    level, message, _ = command_problem(command, facts.get("command") or {}, timeout)
    return message if level == "fail" else ""
