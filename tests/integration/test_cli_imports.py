"""The CLI's startup cost, measured in a fresh interpreter: the third-party modules a
launch needs late are imported late."""

from __future__ import annotations

import json
import subprocess
import sys


def test_launch_starts_without_the_libraries_it_needs_late() -> None:
    """`sshddp launch` starts without PyYAML (imported when a YAML inventory is read),
    fabric and paramiko (when a host is reached over SSH) or rich (when a table is printed):
    the launch waits for every import before its first host (docs/performance.md)."""
    probe = (
        "import json, sys\n"
        "from sshddp.cli.app import cli\n"
        "assert cli.get_command(None, 'launch') is not None\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    loaded = set(json.loads(run.stdout))
    assert "sshddp.cli.launch" in loaded
    assert not loaded & {"yaml", "fabric", "paramiko", "invoke", "rich"}
