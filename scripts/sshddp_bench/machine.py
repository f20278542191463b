"""The machine a measurement ran on: the *Machine* table of a report and of a stored result."""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path

from sshddp_bench import internals

ROOT = Path(__file__).resolve().parents[2]  # the checkout: scripts/sshddp_bench/machine.py


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def tool_version(argv: Sequence[str]) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    return (out.stdout + out.stderr).strip().splitlines()[0]


def source_revision() -> str:
    """The commit measured, and whether src/ had uncommitted changes."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return "not a git checkout"
    dirty = subprocess.run([*git, "status", "--porcelain", "src"], capture_output=True, text=True)
    return f"commit {head.stdout.strip()}" + (" + uncommitted src/ changes" if dirty.stdout else "")


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> list[tuple[str, str]]:
    """The report's *Machine* table as it stands before the suite starts."""
    return [
        ("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
        ("CPU", cpu_model()),
        ("cores", f"{os.cpu_count()} (usable: {len(os.sched_getaffinity(0))})"),
        ("OS", platform.platform()),
        ("python", platform.python_version()),
        ("torch", importlib.metadata.version("torch")),
        ("sshddp", f"{internals.version()}, {source_revision()}"),
        ("OpenSSH", tool_version(["ssh", "-V"])),
        ("pdsh", tool_version(["pdsh", "-V"])),
        ("load average at start (1/5/15 min)", load_average()),
    ]
