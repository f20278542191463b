"""Quarantine: hosts left out of launches for a while because a run ended through them.

``verdicts``: which hosts a run's end (or a launch's preflight) quarantines, and why;
``entries``: the quarantine's entries, their expiry, their file format and their words;
``spares``: which spare takes the node rank of a host a launch cannot use.
"""

from sshddp.model.quarantine.entries import (
    CHECK,
    Entry,
    Quarantine,
    entries,
    finding,
    line,
    marked,
    of_json,
    parse_duration,
    refusal,
    to_json,
    when,
)
from sshddp.model.quarantine.verdicts import (
    Verdict,
    bad_at_launch,
    hardware_error,
    not_there,
    the_hosts_fault,
    verdicts,
)
from sshddp.protocol.hardware import HARDWARE

__all__ = [
    "CHECK",
    "HARDWARE",
    "Entry",
    "Quarantine",
    "Verdict",
    "entries",
    "finding",
    "hardware_error",
    "line",
    "marked",
    "not_there",
    "the_hosts_fault",
    "of_json",
    "parse_duration",
    "refusal",
    "to_json",
    "bad_at_launch",
    "verdicts",
    "when",
]
