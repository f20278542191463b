"""uv for the hosts that lack it is packed once, however many of the pool's threads ask at
once, in a fresh interpreter (where ``sysconfig`` is not yet set up: its first use is not
thread-safe before Python 3.12, and a launch --sync once reported a host "unreachable:
can only concatenate str (not NoneType) to str" from that race)."""

from __future__ import annotations

import os
import subprocess
import sys
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


def test_eight_threads_asking_at_once_pack_uv_once_and_all_get_it() -> None:
    src = Path(__file__).resolve().parents[2] / "src"
    env = dict(os.environ, PYTHONPATH=str(src))
    done = subprocess.run(
        [sys.executable, "-c", CHILD, local_platform()],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip().split(maxsplit=3) == ["1", "8", "1", "[]"], done.stdout + done.stderr
