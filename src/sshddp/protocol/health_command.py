"""What the inventory's ``health:`` command's run (``remote/calls/host_health.py``'s result)
says of a host: one judge for ``doctor --health``, a launch's look at its hosts and spares,
and a spare's own look when node 0 needs it mid-run. Stdlib only: it runs on the hosts too."""

from __future__ import annotations

from typing import Any, Literal, Mapping, Tuple

Level = Literal["ok", "warn", "fail"]
Problem = Tuple[Level, str, str]  #: (level, what was found, what to do about it)
OUTPUT_LINES = 5  #: the last lines of a failed health command quoted as evidence


def command_problem(command: str, result: Mapping[str, Any], timeout: float) -> Problem:
    """The inventory's ``health:`` command's run: a non-zero exit or a timeout fails, with
    the output's last lines as the evidence."""
    tail = [line for line in str(result.get("output") or "").splitlines() if line.strip()]
    evidence = " | ".join(tail[-OUTPUT_LINES:]) or "no output"
    fix = "fix what it found, or take the host out of the inventory"
    if result.get("timed_out"):
        return ("fail", f"`{command}` did not finish in {timeout:g} s: {evidence}", fix)
    if result.get("exit") != 0:
        return ("fail", f"`{command}` exited {result.get('exit')}: {evidence}", fix)
    return ("ok", f"`{command}` passed", "")
