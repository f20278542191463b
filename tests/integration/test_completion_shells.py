"""Shell completion (``_SSHDDP_COMPLETE``) through the real console script: run ids for attach,
logs, ps, stop, stacks and fetch from the local registry alone, commands and options, and a
script for every documented shell."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from completion_runs import RUN_IDS, record_runs
from sshddp.run import registry

SSHDDP_BIN = Path(sys.executable).parent / "sshddp"


# Hosts that cannot be reached: completing a run id must never try.


def complete(words: str) -> list[str]:
    """What Tab offers after ``words`` in a real bash with sshddp's completion loaded."""
    script = (
        'eval "$(_SSHDDP_COMPLETE=bash_source sshddp)"\n'
        f"COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))\n"
        'COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}\n'
        '_sshddp_completion sshddp; printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = {**os.environ, "PATH": f"{SSHDDP_BIN.parent}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "--norc", "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return sorted(line for line in done.stdout.splitlines() if line)


@pytest.mark.parametrize("command", ["attach", "logs", "ps", "stop", "stacks", "fetch"])
def test_run_ids_complete_from_the_registry(command: str) -> None:
    record_runs()
    assert complete(f"sshddp {command} ab") == ["abc123", "abd456"]
    assert complete(f"sshddp {command} ''") == sorted(RUN_IDS)
    assert complete(f"sshddp {command} q") == []


def test_commands_and_options_complete_too() -> None:
    assert "fetch" in complete("sshddp fe")
    assert complete("sshddp fetch --no") == ["--node"]


def test_no_registry_completes_nothing() -> None:
    assert not registry.runs_dir().exists()
    assert complete("sshddp attach a") == []
    assert registry.run_ids() == []


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_every_documented_shell_gets_a_script(shell: str) -> None:
    env = {**os.environ, "_SSHDDP_COMPLETE": f"{shell}_source"}
    done = subprocess.run([SSHDDP_BIN], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "_SSHDDP_COMPLETE" in done.stdout, done.stderr
