"""Hardening of the coordinator's own files and memory, attacked for real on this machine:
another local user's trace file, and a host's output far larger than what sshddp keeps in
memory. Nothing here needs an SSH host: the host named ``localhost`` runs commands here."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from launch_helpers import SSHDDP

from sshddp.errors import ExitCode


@pytest.fixture
def stranger() -> Iterator[pwd.struct_passwd]:
    """A real second local user (made here as root, removed after)."""
    name = f"sshddp-t{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["useradd", "-M", "-s", "/bin/false", name], capture_output=True)
    if made.returncode != 0:
        pytest.fail(f"cannot add user {name} (needs root; CI runs as root): {made.stderr!r}")
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def test_another_users_trace_file_is_refused_and_left_as_it_was(
    tmp_path: Path, stranger: pwd.struct_passwd
) -> None:
    """SSHDDP_LOG names a world-writable file another user made in their own directory:
    appending to it would hand them the trace (hosts, addresses, what sshddp did). It is
    refused with exit 2 and one paragraph naming the file and its owner; the file is left
    empty, with its mode."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    planted = theirs / "trace.log"
    planted.write_text("")
    for path, mode in ((planted, 0o666), (theirs, 0o755)):
        os.chown(path, stranger.pw_uid, stranger.pw_gid)
        path.chmod(mode)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSHDDP_")}
    refused = subprocess.run(
        [*SSHDDP, "ps", "--all"],
        env={**env, "SSHDDP_LOG": str(planted)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == ExitCode.BAD_INPUT, refused.stderr
    assert (
        f"SSHDDP_LOG={planted}: is owned by another user (uid {stranger.pw_uid})" in refused.stderr
    )
    assert "Traceback" not in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr
    assert planted.read_bytes() == b""
    assert stat.S_IMODE(planted.stat().st_mode) == 0o666
