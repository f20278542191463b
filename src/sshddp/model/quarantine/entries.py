"""The quarantine's entries: what the file holds, how they expire, and how they read.

Pure: the file is ``run/quarantine/store.py``'s.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Optional

from sshddp import defaults
from sshddp.model.checks import Finding, HostReport, Status
from sshddp.model.escape import visible
from sshddp.model.quarantine.verdicts import Verdict

VERSION = 1  #: of the quarantine file's format
CHECK = "quarantine"  #: doctor's column

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@dataclass(frozen=True)
class Entry:
    """One quarantined host."""

    host: str  #: as the inventory names it
    reason: str  #: short: why (``Verdict.reason``)
    evidence: str  #: what said so, as the run recorded it
    since: float  #: when it was quarantined (epoch seconds)
    until: float  #: when it leaves quarantine on its own (epoch seconds)
    run_id: str = ""  #: the run whose end quarantined it

    def active(self, now: float) -> bool:
        return now < self.until


@dataclass(frozen=True)
class Quarantine:
    """Every quarantined host, one entry each (the latest)."""

    entries: tuple[Entry, ...] = ()

    def active(self, now: float) -> tuple[Entry, ...]:
        """The entries still in force at ``now``, by host."""
        return tuple(sorted((e for e in self.entries if e.active(now)), key=lambda e: e.host))

    def of(self, host: str, now: float) -> Optional[Entry]:
        return next((e for e in self.active(now) if e.host == host), None)

    def adding(self, new: Iterable[Entry], now: float) -> Quarantine:
        """With ``new`` in force (each replacing its host's entry), expired ones dropped."""
        added = {e.host: e for e in new}
        kept = [e for e in self.active(now) if e.host not in added]
        return Quarantine(tuple(sorted([*kept, *added.values()], key=lambda e: e.host)))

    def clearing(self, hosts: Optional[Sequence[str]], now: float) -> Quarantine:
        """Without ``hosts`` (None: without any), expired ones dropped."""
        if hosts is None:
            return Quarantine()
        return Quarantine(tuple(e for e in self.active(now) if e.host not in hosts))


def entries(found: Sequence[Verdict], now: float, cooldown: float, run_id: str) -> list[Entry]:
    """The entries ``found`` makes, in force for ``cooldown`` seconds (0: none)."""
    if cooldown <= 0:
        return []
    return [Entry(v.host, v.reason, v.evidence, now, now + cooldown, run_id) for v in found]


# --- words --------------------------------------------------------------------------------------


def when(epoch: float) -> str:
    """A moment as the report says it (this machine's local time, to the minute)."""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


def line(entry: Entry) -> str:
    """``quarantined h3 until 2026-12-04 10:12: lost (no heartbeat for 10 s)``."""
    evidence = visible(entry.evidence)
    detail = f" ({evidence})" if evidence and evidence != entry.reason else ""
    return f"quarantined {entry.host} until {when(entry.until)}: {entry.reason}{detail}"


def refusal(found: Sequence[Entry]) -> str:
    """Why a launch does not start: one line per quarantined host, and the two ways out."""
    named = "; ".join(f"{e.host} is quarantined until {when(e.until)}: {e.reason}" for e in found)
    first = found[0].host
    return (
        f"{named}; clear it with `sshddp quarantine --clear {first}` (or --all), or launch "
        "anyway with --ignore-quarantine"
    )


def finding(entry: Entry) -> Finding:
    """Doctor's warning for a quarantined host."""
    message = line(entry)
    return Finding(CHECK, Status.WARN, message, f"sshddp quarantine --clear {entry.host}")


def marked(reports: Sequence[HostReport], store: Quarantine, now: float) -> list[HostReport]:
    """Doctor's reports with a quarantined host's warning."""
    out = []
    for r in reports:
        entry = store.of(r.host.host, now)
        findings = r.findings if entry is None else (*r.findings, finding(entry))
        out.append(replace(r, findings=findings))
    return out


# --- the file's contents ---------------------------------------------------------------------


def to_json(store: Quarantine) -> dict[str, Any]:
    return {"version": VERSION, "hosts": [_entry_json(e) for e in store.entries]}


def _entry_json(e: Entry) -> dict[str, Any]:
    return {
        "host": e.host,
        "reason": e.reason,
        "evidence": e.evidence,
        "since": e.since,
        "until": e.until,
        "run_id": e.run_id,
    }


def of_json(data: object) -> Quarantine:
    """The store a file holds (ValueError naming what is malformed)."""
    if not isinstance(data, Mapping) or not isinstance(data.get("hosts"), list):
        raise ValueError("expected an object with a list 'hosts'")
    out = []
    for i, e in enumerate(data["hosts"]):
        try:
            out.append(_entry_of(e))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"hosts[{i}]: {type(exc).__name__}: {exc}") from None
    return Quarantine(tuple(out))


def _entry_of(e: Mapping[str, Any]) -> Entry:
    texts = [e["host"], e["reason"], e.get("evidence", ""), e.get("run_id", "")]
    if not all(isinstance(t, str) for t in texts) or not e["host"]:
        raise ValueError("host, reason, evidence and run_id are text, host not empty")
    host, reason, evidence, run_id = texts
    return Entry(host, reason, evidence, float(e["since"]), float(e["until"]), run_id)


# --- --quarantine-for ------------------------------------------------------------------------


def parse_duration(text: str) -> float:
    """Seconds from ``24h``, ``30m``, ``90s``, ``2d``, ``1h30m`` or a bare number of seconds;
    ``0``: no quarantine. ValueError saying the expected form."""
    spec = text.strip().lower()
    pos, total = 0, 0.0
    for match in _DURATION.finditer(spec):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT[match.group(2)]
        pos = match.end()
    if not spec or pos != len(spec):
        raise ValueError(f"{text!r} is not a duration: expected e.g. 24h, 30m, 90s, 2d or 0")
    if total > defaults.QUARANTINE_MAX:
        raise ValueError(f"{text!r} is longer than sshddp quarantines ({_days()} days at most)")
    return total


def _days() -> str:
    return f"{defaults.QUARANTINE_MAX / 86400:g}"
