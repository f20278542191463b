"""Ctrl-C while the CLI is still importing its modules (the first fraction of a second):
exit 130 with one line, no traceback. A real ``python -m sshddp`` gets a real SIGINT, sent
from here once the process is inside the import named (a ``sitecustomize`` on its path
says when it got there, then waits for the signal)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from launch_helpers import SSHDDP, wait_until

from sshddp.errors import ExitCode

HOOK = """\
import os, sys, time

def _hook(event, args):
    if event == "import" and args[0] == {module!r} and not os.path.exists({marker!r}):
        open({marker!r}, "w").close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the SIGINT interrupts this, inside the import
            time.sleep(0.01)

sys.addaudithook(_hook)
"""


@pytest.mark.parametrize("module", ["sshddp.cli.app", "click", "sshddp.run.registry"])
def test_ctrl_c_during_the_imports_exits_130_in_one_line(tmp_path: Path, module: str) -> None:
    marker = tmp_path / "importing"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HOOK.format(module=module, marker=str(marker)))
    path = os.pathsep.join([str(site), *sys.path])
    proc = subprocess.Popen(
        [*SSHDDP, "ps", "--all"],
        env={**os.environ, "PYTHONPATH": path, "SSHDDP_STATE_DIR": str(tmp_path / "state")},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(marker.exists, 60, f"the CLI to import {module}")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == ExitCode.INTERRUPTED, err
    assert err == "sshddp: interrupted\n" and out == ""
