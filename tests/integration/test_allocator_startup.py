"""The coordinator's allocator settings (``run.allocator``) in real processes: glibc takes
every setting in a fresh process, and the console script sets them before any command."""

from __future__ import annotations

import os
import subprocess
import sys


def test_glibc_takes_every_setting_in_a_fresh_process() -> None:
    """This machine's C library is glibc: mallopt must accept each parameter (a wrong
    number or value makes it return 0, and tune() False)."""
    code = "import sys; from sshddp.run import allocator; sys.exit(0 if allocator.tune({}) else 3)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode == 0


def test_the_console_script_sets_it_before_any_command() -> None:
    """``sshddp --version`` goes through main(), which tunes first: a setting glibc refuses
    would not fail the command, so check main() calls tune with the process environment."""
    code = (
        "import sys; from sshddp.run import allocator; calls = [];"
        "allocator.tune = lambda env: calls.append(dict(env)) or True;"
        "from sshddp.cli.app import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit:\n    pass\n"
        "sys.exit(0 if len(calls) == 1 and calls[0].get('PROBE') == 'x' else 4)"
    )
    env = {**os.environ, "PROBE": "x"}
    got = subprocess.run([sys.executable, "-c", code], env=env, timeout=60, capture_output=True)
    assert got.returncode == 0, got.stderr
