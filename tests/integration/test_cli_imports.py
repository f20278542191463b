"""The CLI's startup cost, measured in a fresh interpreter: a command imports only what it
needs."""

from __future__ import annotations

import json
import subprocess
import sys

from sshddp.cli.app import COMMANDS as COMMAND_MODULES


def test_a_command_imports_only_what_it_needs() -> None:
    """`sshddp launch` starts without the other commands' modules, PyYAML (imported when a
    YAML inventory is read), fabric and paramiko (when a host is reached over SSH) or rich
    (when a table is printed): the launch waits for every import before its first host
    (docs/performance.md)."""
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
    others = {module for module, _ in COMMAND_MODULES.values()} - {"sshddp.cli.launch"}
    assert not loaded & (others | {"yaml", "fabric", "paramiko", "invoke", "rich"})
