"""What in a rank's output shows a hardware fault, not the user's code: one table, read by
the supervisor of the node whose rank died (it tells node 0, which seats a spare in the
node's place mid-run) and by the coordinator at the run's end (``model/quarantine``).
Stdlib only: it runs on the hosts too."""

from __future__ import annotations

import re
from typing import Iterable, Optional

#: (name, pattern): what in a failing node's output shows a hardware fault
HARDWARE: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("uncorrectable ECC error", re.compile(r"uncorrectable ECC", re.IGNORECASE)),
    ("GPU Xid error", re.compile(r"\bXid\b[\s:(]")),
    (
        "NCCL unhandled system error on a local device",
        re.compile(
            r"unhandled system error.*(?:\bdevice\b|\bGPU\b|/dev/|\bNVML\b|\bibv_|\bmlx\d)",
            re.IGNORECASE,
        ),
    ),
)


def first_hardware_error(lines: Iterable[str]) -> Optional[tuple[str, str]]:
    """The first hardware fault ``lines`` show: its name and the line (stripped), else
    None."""
    for line in lines:
        for name, pattern in HARDWARE:
            if pattern.search(line):
                return name, line.strip()
    return None
