"""Hardening of the coordinator's own files and memory, attacked for real on this machine:
another local user's trace file, and a host's output far larger than what sshddp keeps in
memory. Nothing here needs an SSH host: the host named ``localhost`` runs commands here."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import threading
import time
from pathlib import Path

from launch_helpers import SSHDDP

from sshddp.errors import ExitCode


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


#: Writes BLOCKS pieces of 1 MiB, each its own (its index repeated), then a last line.
FLOOD = (
    "import sys\n"
    "for i in range(int(sys.argv[1])):\n"
    "    sys.stdout.buffer.write(b'%08d' % i * 131072)\n"
    "sys.stdout.buffer.write(b'end\\n')\n"
)
BLOCKS = 100


def _watch_peak(pid: int, peaks: list[int]) -> None:
    """The CLI's own peak RSS (VmHWM: its image since exec; ``wait4``'s ru_maxrss would
    count the test process it was forked from), read until it exits."""
    status = Path(f"/proc/{pid}/status")
    while True:
        try:
            text = status.read_text()
        except OSError:
            return
        if "\nState:\tZ" in text or "VmHWM" not in text:
            return  # a zombie has no memory left to count
        kib = int(text.split("VmHWM:")[1].split()[0])
        peaks.append(kib * 1024)
        time.sleep(0.02)


def test_exec_keeps_a_flood_of_output_out_of_memory_and_prints_it_whole(tmp_path: Path) -> None:
    """A host's command writes 100 MiB: `exec` (no --stream) keeps what is past
    EXEC_IN_MEMORY in a private temporary file, so the coordinator's peak RSS stays far
    below the output's size (it held it all, and two copies for the report, before: 218 MB
    for 97 MB), and prints it byte for byte (its SHA-256), with nothing left in TMPDIR."""
    import hashlib
    import sys

    expected = hashlib.sha256()
    header = b"----------------\nlocalhost (exit 0)\n----------------\n"
    expected.update(header)
    for i in range(BLOCKS):
        expected.update(b"%08d" % i * 131072)
    expected.update(b"end\n")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSHDDP_")}
    command = ["exec", "-H", "localhost", "--", sys.executable, "-c", FLOOD, str(BLOCKS)]
    proc = subprocess.Popen(
        [*SSHDDP, *command], env={**env, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    peaks: list[int] = []
    watcher = threading.Thread(target=_watch_peak, args=(proc.pid, peaks), daemon=True)
    watcher.start()
    got, size = hashlib.sha256(), 0
    while piece := proc.stdout.read(1 << 20):
        got.update(piece)
        size += len(piece)
    watcher.join()  # it ends as the CLI's /proc entry does: at its exit, before the reap
    assert proc.wait() == ExitCode.OK
    assert size == len(header) + BLOCKS * (1 << 20) + 4
    assert got.hexdigest() == expected.hexdigest()
    peak = max(peaks)
    assert peak < 80 * (1 << 20), f"peak RSS {peak / (1 << 20):.0f} MiB for 100 MiB of output"
    assert list(tmp.iterdir()) == []  # the spill directory went with the command
