"""uv for the hosts that lack it is packed once, however many of the pool's threads ask at
once, in a fresh interpreter (where ``sysconfig`` is not yet set up: its first use is not
thread-safe before Python 3.12, and a launch --sync once reported a host "unreachable:
can only concatenate str (not NoneType) to str" from that race); and the next sync takes it
from this user's cache."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

from sshddp.run.sync import local_platform

CHILD = """
import sys, threading, zlib
from sshddp.run import sync

packs = []
real = zlib.compress
def counted(data, level=-1):
    packs.append(len(data))
    return real(data, level)
sync.zlib.compress = counted

platform = sys.argv[1]
got, errors = [], []
def ask():
    try:
        got.append(sync._uv_packed(platform))
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=ask) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(len(packs), len(got), len({bytes(g) for g in got}), errors)
"""


def _ask_eight(cache: Path) -> list[str]:
    """A fresh interpreter's 8 threads asking for uv at once: how many times it was packed,
    how many got it, how many different answers, the errors."""
    src = Path(__file__).resolve().parents[2] / "src"
    env = dict(os.environ, PYTHONPATH=str(src), XDG_CACHE_HOME=str(cache))
    done = subprocess.run(
        [sys.executable, "-c", CHILD, local_platform()],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip().split(maxsplit=3)


def test_eight_threads_asking_at_once_pack_uv_once_and_all_get_it(tmp_path: Path) -> None:
    assert _ask_eight(tmp_path) == ["1", "8", "1", "[]"]
    (kept,) = (tmp_path / "sshddp").glob("uv-*.zlib")
    # the next sync, another process, sends what the cache keeps and packs nothing
    assert _ask_eight(tmp_path) == ["0", "8", "1", "[]"]
    assert zlib.decompress(kept.read_bytes())[:4] == b"\x7fELF"
